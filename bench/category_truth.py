"""Categories at the peak against the truth, on a GPU host: each training loop of
``bench/category_loops.py`` recorded both ways and imported by vramlab's own parser.

    python3 bench/category_truth.py [--save tests/snapshots/data/fixtures] [--only a,b]
    python3 bench/category_truth.py --cpu   # no GPU: the loops and the truth on the CPU
    python3 bench/category_truth.py --rescore tests/snapshots/data/fixtures  # no GPU: the
        # saved fixtures imported again with today's rules, truth.json's vramlab side rewritten

On the GPU host, this and the GPU tests of ``vramlab record`` (about 6 minutes):

    export PYTHONPATH=$PWD:$PWD/client:/tmp/site VRAMLAB_TEST_ENGINES=sqlite
    python3 bench/category_truth.py --save tests/snapshots/data/fixtures --markdown; \
    python3 -m pytest -m cuda tests/snapshots/test_record_cuda.py -q -rs; \
    python3 -m pytest tests/snapshots/test_fixtures.py -q

For each fixture (``set_to_none`` true and false, gradient accumulation, AMP with a
GradScaler, activation checkpointing reentrant and not, foreach and fused Adam, SGD with
momentum, a loop that runs out of memory):

- **truth**: parameter, gradient and optimizer-state bytes exactly (tensor identities) at
  the peak of PyTorch's ``MemTracker`` run on the same loop, its activations and
  temporaries, plus the library workspaces (``category_loops``);
- **recorded**: the loop run under ``vramlab record``'s bootstrap (stacks ``python``), its
  categories recorded from inside the program;
- **inferred**: the loop recorded with ``torch.cuda.memory._record_memory_history(
  stacks="python")`` alone (``context="alloc"`` for non-reentrant checkpointing, which
  breaks with stacks at frees), its categories inferred.

Both snapshots go through ``app.snapshots.parse.convert``, as an upload does. Error:
(vramlab - truth) / max(truth, 1% of the peak), so a category of a few bytes is judged
against the peak; goals 1% (recorded) and 5% (inferred): "within" says the error is within
the goal, MISSED that it is not. ``--save DIR`` writes each fixture's two snapshots
(gzipped, host paths dropped from frames and argv) and ``truth.json`` (the truth and what
vramlab gave) for
``tests/snapshots/test_fixtures.py``.
"""

import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(ROOT), str(ROOT / "client"), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

GOALS = {"recorded": 1.0, "inferred": 5.0}
MAX_SAVED = 3 * 2**20  # a fixture snapshot larger than this (gzipped) is not saved
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "other",
    "unknown",
)


def plain_pass(name: str, out: Path) -> None:
    """In a fresh process: the loop recorded with PyTorch's history alone (the snapshot a
    user uploads), then the truth run of the same loop."""
    import gc

    import category_loops as loops
    import torch

    fx = loops.FIXTURES[name]
    if fx.oom:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(loops.OOM_CAP / total)
    context = "alloc" if fx.checkpoint == "non_reentrant" else "all"
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python")
    parts = loops.build(fx, "cuda")
    try:
        steps = loops.train(fx, parts, "cuda")
    except torch.OutOfMemoryError:
        steps = -1
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    snapshot["memory_stats"] = [{str(k): int(v) for k, v in stats.items()}]
    workspaces = loops.untracked(parts)
    (out / f"{name}.python.pickle").write_bytes(pickle.dumps(snapshot, protocol=4))
    del parts, snapshot
    gc.collect()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    found = loops.truth(fx, "cuda", workspaces)
    found.update(
        fixture=name,
        config=fx.__dict__,
        steps_recorded=steps,
        allocated_peak=int(stats["allocated_bytes.all.peak"]),
        torch=str(torch.__version__),
        gpu=torch.cuda.get_device_name(0),
    )
    (out / f"{name}.truth.json").write_text(json.dumps(found))


def recorded_pass(name: str, out: Path) -> int:
    """The loop as a program under ``vramlab record``'s bootstrap; its exit status."""
    from vramlab import recorder

    command = [sys.executable, str(HERE / "category_loops.py"), name]
    with recorder.recorded(command, "python", None) as run:
        if run.path is not None:
            shutil.copyfile(run.path, out / f"{name}.recorded.pickle")
        return run.code


def scrubbed(path: Path) -> bytes:
    """The snapshot as pickle bytes, the host's paths dropped from its frames."""
    from make_snapshots import scrub

    with path.open("rb") as f:
        data = pickle.load(f)  # our own child's file
    environment = data.get("environment")
    if isinstance(environment, dict) and isinstance(environment.get("argv"), list):
        # The program's path as the checkout's, not the host's.
        here = str(ROOT) + os.sep
        environment["argv"] = [str(a).removeprefix(here) for a in environment["argv"]]
    return pickle.dumps(scrub(data), protocol=4)


def imported(raw: bytes) -> dict[str, Any]:
    """vramlab's summary of a snapshot, as its import makes it."""
    from app.snapshots.parse import convert_records
    from app.snapshots.read import load

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.pickle"
        src.write_bytes(raw)
        loaded = load(src, Path(tmp), 2**32, False)
        try:
            summary: dict[str, Any] = convert_records(
                loaded.data, loaded.sink, Path(tmp), 50_000, None
            )
        finally:
            loaded.sink.close()
            loaded.sink.remove()
    return summary


def score(result: dict[str, Any], way: str, raw: bytes) -> None:
    """``result[way]``: the categories of one of its snapshots as vramlab imports it."""
    summary = imported(raw)
    result[way] = {c["category"]: c["bytes"] for c in summary["categories"]}
    result[way]["peak"] = summary["peak"]["allocated"] if summary["peak"] else 0
    result[f"{way}_recorded_bytes"] = sum(c.get("recorded_bytes", 0) for c in summary["categories"])


def rescore(folder: Path, names: list[str] | None) -> list[dict[str, Any]]:
    """The saved fixtures in ``folder`` imported again with today's code, on the CPU: the
    truth as the GPU host measured it, vramlab's categories recomputed; ``truth.json``
    rewritten."""
    path = folder / "truth.json"
    results: list[dict[str, Any]] = json.loads(path.read_text())
    for r in results:
        if names is not None and r["fixture"] not in names:
            continue
        for way in ("recorded", "inferred"):
            kept = r.get(f"{way}_file")
            if kept:
                score(r, way, gzip.decompress((folder / kept).read_bytes()))
        r["rows"] = rows_of(r)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return [r for r in results if names is None or r["fixture"] in names]


def error(got: int | None, truth: int, peak: int) -> float | None:
    if got is None:
        return None
    return 100.0 * (got - truth) / max(truth, peak / 100, 1)


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per category: truth, recorded and inferred bytes, errors in percent."""
    truth = result["truth"]["categories"]
    peak = sum(truth.values())
    rows = []
    for c in (*CATEGORIES, "peak"):
        t = peak if c == "peak" else truth[c]
        row: dict[str, Any] = {"category": c, "truth": t}
        for way in ("recorded", "inferred"):
            cats = result.get(way)
            got = None if cats is None else cats.get(c)
            row[way] = got
            row[f"{way}_error"] = error(got, t, peak)
        rows.append(row)
    return rows


def verdict(err: float | None, goal: float) -> str:
    if err is None:
        return "-"
    return "within" if abs(err) <= goal else "MISSED"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def pct(e: float | None) -> str:
    return "-" if e is None else f"{e:+.2f}%"


def markdown(results: list[dict[str, Any]]) -> None:
    """The table for docs/snapshots.md: a row per loop and category."""
    print("| loop | category | truth | recorded (error) | inferred (error) |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        for row in rows_of(r):
            cells = [
                f"{mib(row[way])} MiB ({pct(row[f'{way}_error'])})"
                f" {verdict(row[f'{way}_error'], GOALS[way])}"
                if row[way] is not None
                else "-"
                for way in ("recorded", "inferred")
            ]
            print(
                f"| {r['fixture']} | {row['category']} | {mib(row['truth'])} MiB | "
                + " | ".join(cells)
                + " |"
            )


def report(results: list[dict[str, Any]]) -> None:
    print(
        f"{'fixture':<19}{'category':<16}{'truth MiB':>11}{'recorded':>11}{'err':>10} "
        f"{'':<6}{'inferred':>11}{'err':>10} "
    )
    summary = []
    for r in results:
        worst = {"recorded": (0.0, ""), "inferred": (0.0, "")}
        for row in rows_of(r):
            cells = []
            for way in ("recorded", "inferred"):
                e = row[f"{way}_error"]
                cells.append(f"{mib(row[way]):>11}{pct(e):>10} {verdict(e, GOALS[way]):<6}")
                if e is not None and row["category"] != "peak" and abs(e) >= abs(worst[way][0]):
                    worst[way] = (e, row["category"])
            print(
                f"{r['fixture']:<19}{row['category']:<16}{mib(row['truth']):>11}" + "".join(cells)
            )
        summary.append((r, worst))
        t = r["truth"]
        at = sum(t["categories"].values())
        if t.get("allocated_peak") not in (None, at):
            print(
                f"{r['fixture']}: the truth is taken at {mib(at)} MiB, the recorded run's "
                f"allocator peaked at {mib(t['allocated_peak'])} MiB: not the same moment"
            )
        if t.get("steps") != t.get("steps_recorded", t.get("steps")):
            print(
                f"{r['fixture']}: the truth run did {t.get('steps')} steps, the recorded "
                f"{t.get('steps_recorded')} (-1: out of memory): not the same run"
            )
    print()
    print(f"{'fixture':<19}{'exit':>5}{'worst recorded':>28}{'':>7}{'worst inferred':>28}")
    for r, worst in summary:
        line = ""
        for way in ("recorded", "inferred"):
            e, c = worst[way]
            has = r.get(way) is not None
            said = f"{pct(e)} {c}" if has else "-"
            line += f"{said:>28} {verdict(e if has else None, GOALS[way]):<6}"
        print(f"{r['fixture']:<19}{r.get('exit', '-')!s:>5}{line}")


def run_fixture(name: str, work: Path, save: Path | None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--plain-pass", name, str(work)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name}: the plain pass failed\n{done.stderr[-3000:]}")
    code = recorded_pass(name, work)
    truth = json.loads((work / f"{name}.truth.json").read_text())
    result: dict[str, Any] = {"fixture": name, "truth": truth, "exit": code}
    for way, suffix in (("recorded", "recorded"), ("inferred", "python")):
        path = work / f"{name}.{suffix}.pickle"
        if not path.exists():
            result[way] = None
            continue
        raw = scrubbed(path)
        score(result, way, raw)
        if save is not None:
            packed = gzip.compress(raw, mtime=0)
            if len(packed) <= MAX_SAVED:
                (save / f"{name}.{suffix}.pickle.gz").write_bytes(packed)
                result[f"{way}_file"] = f"{name}.{suffix}.pickle.gz"
            else:
                print(f"{name}: {suffix} snapshot is {len(packed)} bytes gzipped; not saved")
    return result


def cpu_run(names: list[str]) -> list[dict[str, Any]]:
    """No GPU: each loop and its truth on the CPU (MemTracker, tensor identities), the
    table without snapshots. Checks the code paths the GPU run takes."""
    import dataclasses

    import category_loops as loops

    results = []
    for name in names:
        fx = loops.FIXTURES[name]
        if fx.oom:
            fx = dataclasses.replace(fx, steps=2)  # no cap on the CPU
        truth = loops.truth(fx, "cpu", 0)
        results.append({"fixture": name, "truth": truth, "recorded": None, "inferred": None})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--save", type=Path, help="write the fixtures and truth.json here")
    parser.add_argument("--only", help="comma-separated fixture names")
    parser.add_argument("--cpu", action="store_true", help="no GPU: the loops and truth only")
    parser.add_argument("--markdown", action="store_true", help="also the docs' table")
    parser.add_argument(
        "--rescore",
        type=Path,
        metavar="DIR",
        help="no GPU: import the fixtures saved in DIR again with today's code and rewrite "
        "its truth.json (the truth kept as measured)",
    )
    parser.add_argument("--plain-pass", nargs=2, metavar=("FIXTURE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_pass:
        plain_pass(args.plain_pass[0], Path(args.plain_pass[1]))
        return 0

    started = time.monotonic()
    if args.rescore:
        results = rescore(args.rescore, args.only.split(",") if args.only else None)
        if args.markdown:
            markdown(results)
            print()
        report(results)
        print(f"\n{len(results)} fixtures rescored in {time.monotonic() - started:.0f} s")
        return 0
    import category_loops as loops

    names = args.only.split(",") if args.only else list(loops.FIXTURES)
    failed: list[str] = []
    if args.cpu:
        results = cpu_run(names)
    else:
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
        results = []
        with tempfile.TemporaryDirectory(prefix="vramlab-truth-") as tmp:
            for name in names:
                t = time.monotonic()
                try:
                    results.append(run_fixture(name, Path(tmp), args.save))
                except Exception as exc:  # the others' results still count
                    failed.append(f"{name}: {exc}")
                print(f"{name}: {time.monotonic() - t:.1f} s", file=sys.stderr)
    if args.save and not args.cpu:
        for r in results:
            r["rows"] = rows_of(r)
        (args.save / "truth.json").write_text(json.dumps(results, indent=1) + "\n")
        kept = sum(f.stat().st_size for f in args.save.glob("*.pickle.gz"))
        print(f"saved in {args.save}: {kept / 2**20:.1f} MiB of snapshots, and truth.json")
    if args.markdown:
        markdown(results)
        print()
    report(results)
    for line in failed:
        print(f"FAILED {line}")
    print(f"\n{len(results)} fixtures in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
