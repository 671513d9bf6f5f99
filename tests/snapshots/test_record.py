"""``vramlab record``: runs a program with the recording bootstrap on its PYTHONPATH,
uploads the snapshot it leaves, prints the page, exits with the program's status."""

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.results.test_cli import run

# Stands in for the bootstrap's dump where there is no GPU: writes what PyTorch's
# _dump_snapshot would, where vramlab record asked for it, then exits with a status.
FAKE_PROGRAM = textwrap.dedent(
    """
    import os, pickle, sys
    sys.path.insert(0, {root!r})
    from tests.snapshots.synthetic import training_snapshot
    assert os.environ["VRAMLAB_RECORD_OWNER"] == str(os.getpid())  # the bootstrap ran
    with open(os.environ["VRAMLAB_RECORD_OUT"], "wb") as f:
        pickle.dump(training_snapshot(iterations=2), f)
    sys.exit(int(sys.argv[1]))
    """
)


def _record(
    server: LiveServer, program: Path, *args: str, program_args: tuple[str, ...] = ("3",)
) -> subprocess.CompletedProcess[str]:
    """``vramlab record [args] -- python program [program_args]`` against the server."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "record",
            "--api",
            server.url,
            *args,
            "--",
            sys.executable,
            str(program),
            *program_args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_record_uploads_what_the_program_left_and_keeps_its_status(
    server: LiveServer, client: httpx.Client, tmp_path: Path
) -> None:
    program = tmp_path / "train.py"
    program.write_text(FAKE_PROGRAM.format(root=str(Path(__file__).resolve().parents[2])))
    done = _record(server, program, "--name", "my run", "--tag", "x")
    assert done.returncode == 3, done.stderr
    url = done.stdout.strip().splitlines()[-1]
    assert url.startswith(f"{server.url}/ui/snapshots/")
    snap_id = url.rsplit("/", 1)[1]
    snap = client.get(f"/v1/snapshots/{snap_id}").json()
    assert snap["name"] == "my run" and snap["gzipped"]
    assert sorted(snap["tags"]) == ["failed", "x"]  # the program exited non-zero
    assert (snap["program_exit"], snap["partial"]) == (3, True)
    assert "marked partial" in done.stderr
    page = client.get(url)
    assert page.status_code == 200 and "optimizer state" in page.text
    assert "Partial: the recorded program exited with status 3" in page.text
    shown = run(server.url, "show", snap_id[:8])
    assert "partial: the recorded program exited with status 3" in shown.stdout, shown.stderr


@pytest.mark.parametrize("code", [0, 3])
def test_record_without_cuda_says_so_and_passes_the_status_on(
    server: LiveServer, tmp_path: Path, code: int
) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the message on a machine without CUDA")
    program = tmp_path / "noop.py"
    program.write_text("import sys; sys.exit(int(sys.argv[1]))\n")
    done = _record(server, program, program_args=(str(code),))
    assert "no CUDA device; nothing recorded" in done.stderr
    assert "left no snapshot" in done.stderr
    assert done.returncode == code  # the program's status, 0 included


def test_what_the_bootstrap_adds_is_plain_data() -> None:
    """torch hands out subclasses (TorchVersion, OrderedDict) that vramlab's loader would
    refuse as classes; the bootstrap turns them into builtins first. (This refused the
    first recording made on the GPU host.)"""
    import io
    import pickle
    from collections import OrderedDict

    torch = pytest.importorskip("torch")
    from app.snapshots import safe_pickle
    from vramlab.recorder_boot.sitecustomize import plain

    added = {"environment": {"torch": torch.__version__}, "stats": [OrderedDict(a=1)]}
    with pytest.raises(safe_pickle.Refused):
        safe_pickle.load(io.BytesIO(pickle.dumps(added)))
    loaded = safe_pickle.load(io.BytesIO(pickle.dumps(plain(added))))
    assert loaded == {"environment": {"torch": str(torch.__version__)}, "stats": [{"a": 1}]}


KILLED_PROGRAM = textwrap.dedent(
    """
    import os, pickle, signal, sys
    sys.path.insert(0, {root!r})
    from tests.snapshots.synthetic import training_snapshot
    if sys.argv[1] == "dumped":
        with open(os.environ["VRAMLAB_RECORD_OUT"], "wb") as f:
            pickle.dump(training_snapshot(iterations=2), f)
    print("killing myself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("dumped", [True, False])
def test_a_program_killed_by_a_signal_gives_a_shells_status(
    server: LiveServer, client: httpx.Client, tmp_path: Path, dumped: bool
) -> None:
    """128 + the signal, as a shell says of the program itself (not Python's -9, which
    an exit status cannot carry: it read 247)."""
    program = tmp_path / "killed.py"
    program.write_text(KILLED_PROGRAM.format(root=str(Path(__file__).resolve().parents[2])))
    done = _record(server, program, program_args=("dumped" if dumped else "nothing",))
    assert done.returncode == 128 + 9, done.stderr
    assert done.stdout.startswith("killing myself\n")
    if not dumped:
        assert "killed by signal 9 before it could dump" in done.stderr
        return
    assert "was stopped by signal 9" in done.stderr
    snap_id = done.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    snap = client.get(f"/v1/snapshots/{snap_id}").json()
    assert (snap["program_exit"], snap["partial"]) == (-9, True)
