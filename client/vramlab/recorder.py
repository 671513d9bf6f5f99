"""Recording a program of yours: run it with PyTorch's allocation history on and find the
snapshot it leaves (``vramlab record`` and ``Client.record``).

Your program runs here, on your machine, as you would run it; the service never runs
it. The recording is switched on by a ``sitecustomize`` (``vramlab/recorder_boot``) put
first on the program's PYTHONPATH; it dumps at exit and at the first out-of-memory error.
The upload is gzipped as it streams.
"""

import os
import subprocess
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BOOT = Path(__file__).resolve().parent / "recorder_boot"
_BLOCK = 1 << 20


@dataclass
class Recording:
    """What ``Client.record`` gives back: the program's exit status, and the API's summary
    of the snapshot it uploaded (None when the program left none, as without CUDA)."""

    code: int
    snapshot: dict[str, Any] | None


@dataclass
class Run:
    """A recorded program that has ended: its exit status and what it left."""

    command: list[str]
    code: int
    path: Path | None  # the snapshot (at exit, or at the first OOM), None if none
    oom: bool  # the program ran out of memory (its OOM dump exists)
    tags: list[str] = field(default_factory=list)  # failed, oom: what the upload adds

    @property
    def name(self) -> str:
        """A snapshot's default name: the command's first words."""
        return " ".join(Path(c).name for c in self.command[:3])[:200]


def gzipped(path: Path) -> Iterator[bytes]:
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            if out := comp.compress(block):
                yield out
    yield comp.flush()


@contextmanager
def recorded(command: Sequence[str], stacks: str, max_entries: int | None) -> Iterator[Run]:
    """Run ``command`` with the recording on and wait for it; the Run lives (its snapshot
    file with it) until the block ends. FileNotFoundError: no such program."""
    command = list(command)
    with tempfile.TemporaryDirectory(prefix="vramlab-record-") as folder:
        out = Path(folder) / "snapshot.pickle"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT), env.get("PYTHONPATH", "")) if p)
        env["VRAMLAB_RECORD_OUT"] = str(out)
        env["VRAMLAB_RECORD_STACKS"] = stacks
        env.pop("VRAMLAB_RECORD_OWNER", None)
        if max_entries is not None:
            env["VRAMLAB_RECORD_MAX_ENTRIES"] = str(max_entries)
        code = subprocess.call(command, env=env)
        oom = out.with_name(out.name + ".oom")
        found = out if out.exists() else oom if oom.exists() else None
        tags = ["failed"] if code != 0 else []
        if found is not None and (found == oom or oom.exists()):
            tags.append("oom")
        yield Run(command, code, found, oom.exists(), tags)
