"""Importing a PyTorch memory snapshot (received by ``upload``): parsed in a bounded
child process, stored as an experiment of kind ``snapshot`` with its trace in the trace
table, so every view of an experiment works on it.

The API never unpickles the upload: the child (``app.snapshots.parse``) does, with no
globals, under an address-space limit and a time limit; the API reads back the child's
gzip chunks one at a time, so its own memory stays flat whatever the snapshot's size.
"""

import gzip
import json
import logging
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

import app
import vramlab
from app.core import ids
from app.core.config import Settings
from app.core.errors import ApiError, NotFound, PayloadTooLarge
from app.figures import bands
from app.figures import service as figures
from app.figures.chart import Chart, Label, Line, human_bytes
from app.figures.service import label
from app.snapshots.categories import telling_frames
from app.snapshots.schemas import SnapshotOut
from app.snapshots.upload import SnapshotRefused, Upload
from app.tables import Experiment, ExperimentTag, Result, Snapshot, TraceChunk
from app.traces import service as traces
from vramlab.contract import Status

KIND = "snapshot"
# Where the parser's imports live: the server's packages and the contract's (the client's
# folder, in a checkout).
_IMPORT_ROOTS = tuple(
    dict.fromkeys(str(Path(m.__path__[0]).resolve().parent) for m in (app, vramlab))
)
log = logging.getLogger("vramlab.snapshots")


class ParserFailed(ApiError):
    """The parser child crashed without a verdict: vramlab's fault, never the client's."""

    status_code = 500
    type = "internal"


def _limits(memory: int, seconds: float) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    return apply


@dataclass
class Parsed:
    out: Path
    summary: dict[str, Any]


def parse(upload: Upload, settings: Settings, device: int | None) -> Parsed:
    """Run the parser child on the upload; refuse with 422 or 413 what it could not read."""
    out = upload.folder / "out"
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "app.snapshots.parse",
        str(upload.path),
        str(out),
        "--max-expanded",
        str(settings.max_snapshot_expanded_bytes),
        "--delete-src",
    ]
    if device is not None:
        command += ["--device", str(device)]
    # A clean environment, but the same import path as the API: vramlab first, then
    # wherever the API's own dependencies were found (a PYTHONPATH install among them).
    inherited = os.environ.get("PYTHONPATH", "")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in (*_IMPORT_ROOTS, inherited) if p),
        "PYTHONHASHSEED": "0",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=upload.folder,
            preexec_fn=_limits(
                settings.snapshot_parse_memory_bytes, settings.snapshot_parse_seconds
            ),
            timeout=settings.snapshot_parse_seconds,
            capture_output=True,
        )
    except subprocess.TimeoutExpired:
        raise PayloadTooLarge(
            f"parsing the snapshot took longer than {settings.snapshot_parse_seconds:.0f} s "
            "(VRAMLAB_SNAPSHOT_PARSE_SECONDS)"
        ) from None
    result_file = out / "result.json"
    if done.returncode > 0 and not result_file.exists():
        # The parser failed without its own verdict: a bug (or a broken install), not the
        # snapshot's size. Say so, and keep what it printed for the operator.
        log.error(
            "snapshot parser exited %s: %s",
            done.returncode,
            done.stderr.decode(errors="replace")[-4000:],
        )
        raise ParserFailed(
            f"the snapshot parser failed (exit status {done.returncode}); the API's log has "
            "its output"
        )
    if done.returncode != 0 or not result_file.exists():
        raise PayloadTooLarge(
            "the snapshot parser stopped before it finished (exit status "
            f"{done.returncode}): the snapshot needs more than "
            f"{settings.snapshot_parse_memory_bytes} bytes of memory or "
            f"{settings.snapshot_parse_seconds:.0f} s of CPU to parse"
        )
    result = json.loads(result_file.read_text())
    if not result.get("ok"):
        message = str(result.get("message") or "not a memory snapshot")
        if result.get("type") == "too_large":
            raise PayloadTooLarge(message)
        raise SnapshotRefused(message)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = result["summary"]
    # What parsing cost, for the docs' figures and for operators sizing the limits.
    summary["import"] = {
        "parse_wall_s": round(time.monotonic() - started, 3),
        "parse_cpu_s": round(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3
        ),
        "parser_peak_rss_bytes": after.ru_maxrss * 1024,
        "pickle_bytes": summary.pop("pickle_bytes", None),
    }
    return Parsed(out, summary)


def store(
    session: Session,
    upload: Upload,
    parsed: Parsed,
    *,
    name: str,
    tags: list[str],
    submitted_by: str | None,
    now: datetime,
    program_exit: int | None = None,
) -> Experiment:
    """The snapshot as a finished experiment, its trace chunk by chunk (one file in memory
    at a time), its segments, in the caller's transaction. ``program_exit``: how the
    recorded program ended, where the recorder said (not 0: the snapshot is partial)."""
    summary = dict(parsed.summary)
    summary["program_exit"] = program_exit
    chunks = summary.pop("chunks")
    has_frames = bool(summary["largest"] and summary["largest"][0].get("frames"))
    exp = Experiment(
        id=str(uuid.uuid4()),
        kind=KIND,
        name=name,
        status=Status.SUCCEEDED,
        op=KIND,
        shape=[],
        params={},
        dtype="",
        device=summary["device"],
        device_type="cuda",
        gpus_needed=0,
        warmup=0,
        repeat=1,
        timeout_s=1.0,
        allocator={},
        trace_mode="stacks" if has_frames else "events",
        prediction={},
        created_at=now,
        available_at=now,
        started_at=now,
        finished_at=now,
        tag_rows=[ExperimentTag(tag=t, created_at=now) for t in dict.fromkeys(tags)],
        submitted_by=submitted_by,
    )
    session.add(exp)
    session.flush()
    session.add(
        Result(
            experiment_id=exp.id,
            attempt=0,
            data={
                "memory": summary["memory"],
                "environment": summary.get("environment") or {},
                "snapshot": summary,
            },
            created_at=now,
        )
    )
    segments = (parsed.out / "segments.json.gz").read_bytes()
    session.add(
        Snapshot(
            experiment_id=exp.id,
            file_bytes=upload.size,
            sha256=upload.sha256,
            gzipped=upload.gzipped,
            segments=segments,
            created_at=now,
        )
    )
    for chunk in chunks:
        data = (parsed.out / f"chunk-{chunk['seq']:05d}.ndjson.gz").read_bytes()
        row_ = TraceChunk(
            experiment_id=exp.id,
            seq=chunk["seq"],
            first_event=chunk["first_event"],
            n_events=chunk["n_events"],
            data=data,
        )
        session.add(row_)
        # Written now and let go: one chunk in memory at a time, whatever the trace's size.
        session.flush()
        session.expunge(row_)
    return exp


def get(session: Session, snapshot_id: str) -> Experiment:
    """By its id or a unique prefix of it among snapshots (``app.core.ids``)."""
    exp: Experiment = ids.resolve(
        session,
        Experiment,
        snapshot_id,
        noun="snapshot",
        field="snapshot_id",
        where=(Experiment.kind == KIND,),
    )
    return exp


def row(session: Session, exp: Experiment) -> Snapshot:
    found = session.get(Snapshot, exp.id)
    if found is None:
        raise NotFound(f"snapshot {exp.id} has no stored file details")
    return found


def summary(exp: Experiment) -> dict[str, Any]:
    data = exp.result.data if exp.result is not None else {}
    out: dict[str, Any] = data.get("snapshot") or {}
    return out


def segments(session: Session, exp: Experiment) -> list[dict[str, Any]]:
    """The segments as PyTorch wrote them, for the memory_viz export."""
    loaded: list[dict[str, Any]] = json.loads(gzip.decompress(row(session, exp).segments))
    return loaded


def to_out(session: Session, exp: Experiment) -> SnapshotOut:
    stored = row(session, exp)
    return SnapshotOut.model_validate(
        {
            **summary(exp),
            "id": exp.id,
            "name": exp.name or "",
            "tags": exp.tags,
            "status": exp.status,
            "created_at": exp.created_at,
            "submitted_by": exp.submitted_by,
            "file_bytes": stored.file_bytes,
            "sha256": stored.sha256,
            "gzipped": stored.gzipped,
        }
    )


# Stored trace entries up to which a snapshot's timeline is drawn as bands (one replay of
# the stored trace, then cached); past it, from the points kept at import.
BAND_LIMIT = 500_000


def timeline(session: Session, exp: Experiment) -> Chart:
    """The snapshot's memory over time: as bands (each large block from its alloc to its
    free, named by its category, recorded or inferred, where it was alive at the peak) when
    its trace has times and at most ``BAND_LIMIT`` entries; else allocated and reserved from the
    points kept at import (about 2,000 whatever the trace's length)."""
    count = traces.count(session, exp.id)
    if 0 < count <= BAND_LIMIT and summary(exp).get("time_recorded"):
        tl = figures.cached(exp, ("snapshot-bands", exp.id, count), lambda: _bands(session, exp))
        return figures.timeline_chart(
            tl, f"Memory over time: {label(exp)}", since="the first recorded entry"
        )
    return _lines(exp)


def _bands(session: Session, exp: Experiment) -> bands.Timeline:
    tl = bands.build(traces.iter_events(session, exp.id), total=traces.count(session, exp.id))
    named = {
        b["seq"]: str(b["category"]).replace("_", " ")
        + (" (recorded)" if b.get("recorded") else " (inferred)")
        for b in summary(exp).get("alive_at_peak") or []
        if b.get("category")
    }
    for alloc in tl.allocs:
        alloc.name = named.get(alloc.seq) or "freed before the peak"
        # Where it came from, past the recorder's and the allocator's own frames.
        alloc.frames = tuple(telling_frames(alloc.frames, 4))
    return tl


def _lines(exp: Experiment) -> Chart:
    """Allocated and reserved over time from the points kept at import: no replay."""
    data = summary(exp).get("timeline") or {}
    xs_us: list[float] = data.get("t_us") or []
    if len(xs_us) < 2:
        raise NotFound(f"snapshot {exp.id} has no trace entries to draw")
    timed = bool(summary(exp).get("time_recorded"))
    xs = [x / 1000 for x in xs_us] if timed else list(xs_us)
    chart = Chart(
        title=f"Memory over time: {label(exp)}",
        x_label="time (ms)" if timed else "trace entry (no times recorded)",
    )
    chart.lines.append(Line("allocated", xs, [float(v) for v in data["allocated"]]))
    chart.lines.append(Line("reserved", xs, [float(v) for v in data["reserved"]]))
    peak = summary(exp).get("peak") or {}
    if peak.get("allocated"):
        x = peak["t_us"] / 1000 if timed else peak["t_us"]
        chart.labels.append(
            Label(x, float(peak["allocated"]), f"peak {human_bytes(peak['allocated'])}")
        )
    return chart
