"""Where a clean child's time goes: cProfile over one experiment in a forked child.

    python bench/child_profile.py [--device cpu|cuda:0] [--op add] [--n 5] [--top 25]
    python bench/child_profile.py --runner [--device cuda:0] [--n 10]

Imports torch and workers.child once (as the forkserver does, never touching CUDA), then
forks N children; each starts its device, runs a tiny experiment through
``workers.experiment.run_experiment`` under cProfile, and writes its stats. Prints the
stages' medians (the same stages the runner reports) and the functions with the most
cumulative time over all N children.

With ``--runner`` it times N experiments through ``workers.runner.Runner`` instead, cold
children, warm spares and a shared process (isolation shared: the same process for all N
after its first) side by side, and prints each stage's median (``runner_launch``: taking
a spare or forking a child; ``handoff``: until the child had the spec; then the child's
stages; ``runner_wait``: launch to result, the child's whole time).
"""

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import workers.child  # noqa: E402, F401  (what the forkserver preloads)
from app.catalog import plan_spec  # noqa: E402
from vramlab.runspec import RunSpec  # noqa: E402
from workers.device import prepare  # noqa: E402
from workers.experiment import Stages, run_experiment  # noqa: E402


def spec_for(op: str, device: str) -> dict[str, object]:
    params = {"other_shape": [256, 256]} if op == "matmul" else {}
    checked, plan = plan_spec(op, (256, 256), params, "float32", device)
    return {
        "op": op,
        "shape": [256, 256],
        "params": checked,
        "dtype": "float32",
        "device": device,
        "warmup": 0,
        "repeat": 1,
        "allocator": {},
        "timeout_s": 120.0,
        "trace": "events",
        "prediction": plan.prediction(device),
    }


def one_child(spec: dict[str, object], out: Path) -> None:
    import gc

    import torch

    gc.freeze()  # as workers.child.main does: the inherited heap is never scanned
    profile = cProfile.Profile()
    stages = Stages()
    profile.enable()
    prepared = prepare(torch.device(str(spec["device"])))
    stages.mark("init_device")
    run = RunSpec.from_wire(spec)
    payload = run_experiment(run, out.with_suffix(".gz"), time.time_ns(), prepared, stages)
    profile.disable()
    assert payload["status"] == "succeeded", payload["error"]
    profile.dump_stats(str(out))
    out.with_suffix(".stages").write_text(repr(stages.times))


def through_runner(spec: dict[str, object], n: int) -> None:
    from workers.runner import Runner

    columns: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    labels = ("cold", "warm", "shared")
    for label in labels:
        runner = Runner(warm=label != "cold")
        runner.start()
        runner.capabilities()
        stages: dict[str, list[float]] = {}
        walls = []
        run_spec = {**spec, "isolation": "shared" if label == "shared" else "clean"}
        for _ in range(n + 1):  # the first is not counted (shared: it starts the process)
            time.sleep(0.5)  # as between a user's experiments: the spare is ready
            started = time.perf_counter()
            outcome = runner.run(RunSpec.from_wire(run_spec))
            walls.append(time.perf_counter() - started)
            assert outcome.status == "succeeded", outcome.error
            if outcome.trace_path is not None:
                outcome.trace_path.unlink()
            for k, v in outcome.stages.items():
                stages.setdefault(k, []).append(v)
        runner.close()
        columns[label] = {k: statistics.median(v[1:]) for k, v in stages.items()}
        totals[label] = statistics.median(walls[1:])
    print(f"\n{spec['op']} 256x256 float32 on {spec['device']} through the runner, n={n}")
    print(f"{'stage':<16} " + " ".join(f"{label + ' ms':>9}" for label in labels))
    for key in dict.fromkeys(k for label in labels for k in columns[label]):
        cells = [columns[c].get(key) for c in labels]
        text = [f"{v * 1000:9.1f}" if v is not None else " " * 9 for v in cells]
        print(f"{key:<16} " + " ".join(text))
    print(f"{'runner.run':<16} " + " ".join(f"{totals[c] * 1000:9.1f}" for c in labels))
    print(
        f"shared over warm: {totals['warm'] / totals['shared']:.2f}x faster; over cold: "
        f"{totals['cold'] / totals['shared']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--op", default="add")
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--runner", action="store_true")
    args = parser.parse_args()
    spec = spec_for(args.op, args.device)
    if args.runner:
        through_runner(spec, args.n)
        return
    folder = Path(tempfile.mkdtemp(prefix="vramlab-profile-"))
    walls = []
    for i in range(args.n):
        out = folder / f"child{i}.prof"
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                one_child(spec, out)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        walls.append(time.perf_counter() - started)
        if status:
            raise SystemExit(f"child {i} failed")
    stages: dict[str, list[float]] = {}
    for i in range(args.n):
        for k, v in eval((folder / f"child{i}.stages").read_text()).items():  # our own file
            stages.setdefault(k, []).append(v)
    print(f"\n{args.op} 256x256 float32 on {args.device}, {args.n} forked children")
    print(f"fork to exit, median {statistics.median(walls):.3f} s")
    for k, v in stages.items():
        print(f"  {k:<14} {statistics.median(v) * 1000:8.1f} ms")
    stats = pstats.Stats(*(str(folder / f"child{i}.prof") for i in range(args.n)))
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.print_callers("_find_and_load")


if __name__ == "__main__":
    main()
