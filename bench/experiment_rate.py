"""Experiments a second through the real service: warm spare children, shared
processes and concurrency against the cold path, side by side in one run.

    python bench/experiment_rate.py [--device cpu|cuda] [--concurrency 4] [--seq 20]
                                    [--burst 60] [--isolation clean|shared]

For each worker setting (cold path one at a time; the worker's default flags one at a
time; warm spares one at a time, with one spare or two; cold and warm with N at once;
with ``--isolation shared`` also shared processes one at a time and N at once) it starts
`vramlab serve` and `vramlab worker` on a temporary SQLite file, then times 20 sequential
tiny `add` experiments (submit to `succeeded`: p50, p95) and a burst of 60 submitted at
once (experiments a second, first submit to last finished). Prints a table and each
figure's ratio against the cold path, whether clean isolation with the default flags
meets the issue's p50 <= 0.15 s, and for shared rows whether its targets (p50 <= 0.15 s
one at a time, >= 20 experiments a second with concurrency) are met.
"""

import argparse
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import psutil
from service import run_to_end, running_service

SPEC: dict[str, Any] = {
    "op": "add",
    "shape": [256, 256],
    "dtype": "float32",
    "warmup": 0,
    "repeat": 1,
    "trace": "events",
}
FINISHED = ("succeeded", "failed", "cancelled")
TARGET_P50_S = 0.15  # the targets: p50 with default flags, and shared processes
TARGET_RATE = 20.0


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def _at(stamp: str) -> float:
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def sequential(
    client: httpx.Client, spec: dict[str, Any], n: int
) -> tuple[list[float], dict[str, Any], dict[str, float]]:
    """Latencies, the last experiment, and the medians of where the time went: queued
    (submit to claim), claimed to finished (the worker: child, upload, report) and
    finished to seen (the client's polling), from the API's own timestamps."""
    out: list[float] = []
    last: dict[str, Any] = {}
    parts: dict[str, list[float]] = {"queued": [], "worker": [], "seen": []}
    for i in range(n + 2):  # the first two start the spares' pages and the API: not counted
        t0 = time.perf_counter()
        last = run_to_end(client, spec)
        seen = time.time()
        if last["status"] != "succeeded":
            raise RuntimeError(f"bench experiment {last['status']}: {last.get('error')}")
        if i >= 2:
            out.append(time.perf_counter() - t0)
            created, started = _at(last["created_at"]), _at(last["started_at"])
            finished = _at(last["finished_at"])
            parts["queued"].append(started - created)
            parts["worker"].append(finished - started)
            parts["seen"].append(seen - finished)
    return out, last, {k: statistics.median(v) for k, v in parts.items()}


def burst(client: httpx.Client, spec: dict[str, Any], n: int) -> float:
    """Experiments a second for ``n`` submitted at once: from the first submit to the last
    finish, by the API's own timestamps. The client looks only every tenth of a second,
    and at one unfinished experiment at most, so that its polling takes little of the
    API's time."""
    tag = f"burst-{uuid.uuid4().hex[:8]}"
    body = {**spec, "tags": [tag]}
    cpu_before = _cpu_seconds()
    with ThreadPoolExecutor(8) as pool:
        for response in pool.map(lambda _: client.post("/v1/experiments", json=body), range(n)):
            response.raise_for_status()
    while True:
        # Cheap to answer: one row at most, none once everything has ended.
        time.sleep(0.1)
        waiting = client.get(
            "/v1/experiments", params={"tag": tag, "status": ["queued", "running"], "limit": 1}
        ).json()
        if waiting["items"]:
            continue
        items = client.get("/v1/experiments", params={"tag": tag, "limit": 200}).json()["items"]
        bad = [e["status"] for e in items if e["status"] != "succeeded"]
        if len(items) != n or bad:
            raise RuntimeError(f"burst: {len(items)} of {n} listed; ended {bad}")
        first = min(_at(e["created_at"]) for e in items)
        last = max(_at(e["finished_at"]) for e in items)
        cpu_after = _cpu_seconds()
        api_ms, worker_ms = ((cpu_after[k] - cpu_before[k]) * 1000 / n for k in (0, 1))
        busy = (cpu_after[0] - cpu_before[0]) / (last - first)
        print(
            f"  burst: API CPU {api_ms:.1f} ms an experiment ({busy:.0%} of one core "
            f"while it ran), worker side (loop, forkserver, children) {worker_ms:.1f} ms",
            flush=True,
        )
        return n / (last - first)


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of the API process and of the worker's process tree."""
    api = worker = 0.0
    for proc in psutil.Process().children():
        try:
            tree = [proc, *proc.children(recursive=True)]
            seconds = sum(sum(p.cpu_times()[:2]) for p in tree)
            if "serve" in proc.cmdline():
                api += seconds
            else:
                worker += seconds
        except psutil.Error:
            continue
    return api, worker


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seq", type=int, default=20)
    parser.add_argument("--burst", type=int, default=60)
    parser.add_argument(
        "--isolation",
        choices=["clean", "shared"],
        default="clean",
        help="shared: also run the experiments in shared processes, beside the clean rows",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every setting this many times, in turn, and report each figure's median "
        "(on a host whose load drifts, each setting then sees the same drift)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only the settings whose label starts with one of these "
        "comma-separated words (e.g. 'shared')",
    )
    args = parser.parse_args()
    clean = {**SPEC, "device": args.device}
    shared = {**clean, "isolation": "shared"}
    n = str(args.concurrency)
    settings = [
        ("cold path, 1 at a time", ["--cold"], clean),
        # The worker's defaults: spares by device (2 on a GPU, 1 on the CPU).
        ("default flags, 1 at a time", [], clean),
        ("1 warm spare, 1 at a time", ["--spares", "1"], clean),
        ("2 warm spares, 1 at a time", ["--spares", "2"], clean),
        ("3 warm spares, 1 at a time", ["--spares", "3"], clean),
        ("4 warm spares, 1 at a time", ["--spares", "4"], clean),
        (f"cold path, {n} at once", ["--cold", "--concurrency", n], clean),
        (f"warm spares, {n} at once", ["--concurrency", n], clean),
        (f"{n} warm spares, {n} at once", ["--concurrency", n, "--spares", n], clean),
    ]
    if args.isolation == "shared":
        settings += [
            ("shared, 1 at a time", [], shared),
            (f"shared, {n} at once", ["--concurrency", n], shared),
        ]
    if args.only:
        words = tuple(w.strip() for w in args.only.split(",") if w.strip())
        settings = [s for s in settings if s[0].startswith(words)]
    runs: dict[str, list[tuple[float, float, float, str | None]]] = {}
    for _ in range(args.rounds):
        for label, worker_args, spec in settings:
            with running_service(args.device, worker_args=worker_args) as client:
                times, last, parts = sequential(client, spec, args.seq)
                rate = burst(client, spec, args.burst)
            env = (last.get("result") or {}).get("environment") or {}
            p50 = statistics.median(times)
            runs.setdefault(label, []).append((p50, p95(times), rate, env.get("child_start")))
            where = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in parts.items())
            print(f"{label}: p50 {p50:.3f} s ({where}), {rate:.1f}/s", flush=True)
    rows = [
        (
            label,
            statistics.median(r[0] for r in measured),
            statistics.median(r[1] for r in measured),
            statistics.median(r[2] for r in measured),
            measured[-1][3],
        )
        for label, measured in runs.items()
    ]
    base = rows[0]
    print(
        f"\nop add 256x256 float32 on {args.device}: {args.seq} sequential "
        f"(submit to succeeded), then a burst of {args.burst}"
        + (f"; medians of {args.rounds} rounds" if args.rounds > 1 else "")
    )
    head = f"{'worker':<28} {'p50 s':>7} {'p95 s':>7} {'burst/s':>8} {'p50 x':>7} {'rate x':>7}"
    print(head + "  child")
    for label, p50, p95_, rate, start in rows:
        print(
            f"{label:<28} {p50:7.3f} {p95_:7.3f} {rate:8.1f} {base[1] / p50:7.2f} "
            f"{rate / base[3]:7.2f}  {start}"
        )
    print(f"(x: the {base[0]!r} p50 over this p50, and this rate over its rate)")
    by_label = {row[0]: row for row in rows}
    default = by_label.get("default flags, 1 at a time")
    if default is not None:
        verdict = "met" if default[1] <= TARGET_P50_S else "not met"
        print(
            f"clean isolation with the worker's default flags: p50 {default[1]:.3f} s one at a "
            f"time (target {TARGET_P50_S} s: {verdict})"
        )
    one, many = by_label.get("shared, 1 at a time"), by_label.get(f"shared, {n} at once")
    if one is not None and many is not None:
        warm, warm_many = (
            by_label.get("default flags, 1 at a time"),
            by_label.get(f"warm spares, {n} at once"),
        )
        if warm is not None and warm_many is not None:
            print(
                f"shared against warm spares: p50 {warm[1] / one[1]:.2f}x faster one at a time, "
                f"burst {many[3] / warm_many[3]:.2f}x the rate {n} at once"
            )
        print(
            f"targets: p50 <= {TARGET_P50_S} s one at a time: {one[1]:.3f} s "
            f"({'met' if one[1] <= TARGET_P50_S else 'not met'}); >= {TARGET_RATE:g}/s with "
            f"concurrency: {many[3]:.1f}/s ({'met' if many[3] >= TARGET_RATE else 'not met'})"
        )


if __name__ == "__main__":
    main()
