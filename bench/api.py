"""The API's speed beside a bare FastAPI app, measured with wrk in one run.

    python bench/api.py [--engines sqlite,postgres] [--seconds 5] [--rows 100000]
                        [--connections 1,16,64] [--rounds 1] [--baseline PATH]

For each database it starts the real ``vramlab serve`` and bench/bare_app.py (a POST that
validates a small pydantic body and inserts one row with SQLAlchemy), then measures:
- submit throughput at 1, 16 and 64 connections (``--connections``), vramlab beside the
  bare app (target: the ratio vramlab / bare >= 0.7, with no error);
- listing 50 of ``--rows`` experiments, without and with a tag filter (target: p95 <= 50 ms);
- a 1,000-point sweep accepted (target: <= 0.5 s, median of 3).
Beside each submit rate it prints the server's CPU time per request (user + system, read
from /proc), which moves far less than the rates with the load others put on the machine.
A figure that misses its target is marked BELOW. ``--rounds N`` measures the submit servers
N times each, interleaved (so that each meets the same load), and prints the medians.
``--baseline PATH`` also starts ``vramlab serve`` from another checkout (the code before a
change) and measures its submits in the same run, between vramlab's and the bare app's.
wrk (loopback only) runs each measurement for ``--seconds``. PostgreSQL is the server at
VRAMLAB_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres); the
benchmark creates its own database there and drops it at the end.
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, insert, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.config import normalise_database_url  # noqa: E402
from app.tables import Experiment, ExperimentTag, Result  # noqa: E402

POSTGRES_URL = os.environ.get(
    "VRAMLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SPEC = {"op": "add", "shape": [256, 256], "dtype": "float32", "device": "cpu"}
BARE_BODY = {"op": "add", "shape": [256, 256], "dtype": "float32", "device": "cpu"}
VRAMLAB_SERVE = [sys.executable, "-m", "app.cli", "serve"]
WRK_SCRIPT = """
wrk.method = "{method}"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  io.write(string.format("BENCH %d %d %d %d %.1f %.1f %.1f\\n",
    summary.requests, summary.errors.status, summary.errors.connect + summary.errors.read
    + summary.errors.write, summary.errors.timeout, latency:percentile(50) / 1000,
    latency:percentile(95) / 1000, summary.duration / 1e6))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def database(engine: str, tmp: Path, name: str = "bench") -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{tmp / f'{name}.db'}"
        return
    admin = normalise_database_url(POSTGRES_URL)
    name = f"vramlab_{name}_{uuid.uuid4().hex[:8]}"
    eng = create_engine(admin, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        with eng.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        eng.dispose()


@contextmanager
def process(
    args: list[str], env: dict[str, str], log: Path, ready: str, cwd: Path | None = None
) -> Iterator[int]:
    """Start a server, wait until ``ready`` answers, yield its pid; stop it at the end."""
    proc = subprocess.Popen(
        args,
        env=env,
        cwd=cwd,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(ready, timeout=2).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{args} did not start; its log ends:\n{tail}")
            time.sleep(0.2)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(
    url: str,
    connections: int,
    seconds: int,
    tmp: Path,
    body: Any = None,
    pid: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """wrk's figures; with ``pid``, also the server's CPU ms per request (``cpu_ms``).
    ``threads``: wrk's threads (default: one per connection, two at most)."""
    script = tmp / f"wrk-{uuid.uuid4().hex[:6]}.lua"
    cpu_before = cpu_seconds(pid) if pid is not None else None
    method = "GET" if body is None else "POST"
    script.write_text(WRK_SCRIPT.format(method=method, body=json.dumps(body) if body else ""))
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads or min(connections, 2)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--timeout",
            "30s",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    ).stdout
    match = re.search(r"^BENCH (.*)$", out, re.M)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    n, bad, sock, timeouts, p50, p95, dur = (float(x) for x in match.group(1).split())
    cpu_after = cpu_seconds(pid) if pid is not None else None
    cpu_ms = None
    if cpu_before is not None and cpu_after is not None and n:
        cpu_ms = 1000 * (cpu_after - cpu_before) / n
    return {
        "cpu_ms": cpu_ms,
        "rps": n / dur,
        "requests": int(n),
        "non2xx": int(bad),
        "socket_errors": int(sock + timeouts),
        "p50_ms": p50,
        "p95_ms": p95,
    }


def seed(url: str, rows: int) -> None:
    """``rows`` finished experiments (a tenth tagged ``t10``, a hundredth ``t100``), each a
    copy of one real submission with a small result, inserted in bulk."""
    # A long busy timeout: the server may still be finishing the submit runs' requests.
    engine = create_engine(url, connect_args={"timeout": 300} if "sqlite" in url else {})
    with engine.begin() as c:
        template = dict(c.execute(select(Experiment.__table__).limit(1)).mappings().one())
    start = datetime(2025, 1, 1, tzinfo=UTC)
    # A whole result's figures, as the contract requires of every stored result.
    memory = {
        "allocated_before": 0,
        "allocated_after": 262144,
        "allocated_peak": 524288,
        "reserved_before": 0,
        "reserved_after": 2097152,
        "reserved_peak": 2097152,
        "delta_allocated": 262144,
        "host_rss_before": 2**28,
        "host_rss_after": 2**28,
    }
    batch = 5000
    for lo in range(0, rows, batch):
        exps, results, tags = [], [], []
        for i in range(lo, min(rows, lo + batch)):
            exp_id = str(uuid.uuid4())
            exps.append(
                {
                    **template,
                    "id": exp_id,
                    "status": "succeeded" if i % 4 else "failed",
                    "idempotency_key": None,
                    "created_at": start + timedelta(seconds=i),
                    "finished_at": start + timedelta(seconds=i, milliseconds=200),
                    "attempts": 1,
                }
            )
            if i % 4:
                results.append({"experiment_id": exp_id, "attempt": 1, "data": {"memory": memory}})
            at = start + timedelta(seconds=i)
            tags.append({"experiment_id": exp_id, "tag": "bench", "created_at": at})
            if i % 10 == 0:
                tags.append({"experiment_id": exp_id, "tag": "t10", "created_at": at})
            if i % 100 == 0:
                tags.append({"experiment_id": exp_id, "tag": "t100", "created_at": at})
        with engine.begin() as c:
            c.execute(insert(Experiment), exps)
            c.execute(insert(Result), results)
            c.execute(insert(ExperimentTag), tags)
    # Statistics and, on PostgreSQL, the visibility map, as autovacuum keeps them.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE"))
    engine.dispose()


def sweep_seconds(url: str, n: int = 3) -> float:
    body = {
        "spec": {"op": "add", "shape": [64], "dtype": "float32", "device": "cpu"},
        "grid": {"shape": [[k] for k in range(1, 201)], "repeat": [1, 2, 3, 4, 5]},
    }
    times = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            response = client.post("/v1/sweeps", json=body)
            times.append(time.perf_counter() - t0)
            if response.status_code != 202:
                raise RuntimeError(f"sweep: {response.status_code} {response.text[:300]}")
    return statistics.median(times)


def run_engine(
    engine: str,
    seconds: int,
    rows: int,
    tmp: Path,
    parts: set[str],
    baseline: Path | None,
    connections: tuple[int, ...] = (1, 16, 64),
    rounds: int = 1,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print(f"\n== {engine} ==")
    print(
        f"{'measure':<36} {'vramlab':>10} {'bare':>10} {'ratio':>7} {'target':>9}"
        "  server CPU ms/request (vramlab / bare)",
        flush=True,
    )
    with database(engine, tmp) as url, ExitStack() as servers:
        env = {
            **os.environ,
            "VRAMLAB_DATABASE_URL": url,
            "BARE_DATABASE_URL": normalise_database_url(url).replace("bench.db", "bare.db"),
            # The benchmark queues far more than one submitter may by default.
            "VRAMLAB_MAX_QUEUED_PER_TOKEN": str(10**9),
        }
        log = tmp / f"{engine}.log"

        def serve(root: Path, database_url: str) -> tuple[str, int]:
            port = free_port()
            pid = servers.enter_context(
                process(
                    [*VRAMLAB_SERVE, "--port", str(port), "--log-level", "warning"],
                    {**env, "VRAMLAB_DATABASE_URL": database_url, **python_path(root)},
                    log,
                    f"http://127.0.0.1:{port}/readyz",
                    cwd=root,
                )
            )
            return f"http://127.0.0.1:{port}", pid

        vramlab_url, vpid = serve(ROOT, url)
        bport = free_port()
        bare = [sys.executable, str(ROOT / "bench" / "bare_app.py"), "--port", str(bport)]
        bpid = servers.enter_context(
            process(bare, {**env, **python_path(ROOT)}, log, f"http://127.0.0.1:{bport}/docs")
        )
        submit_url = f"{vramlab_url}/v1/experiments"
        targets = {
            "submit": (submit_url, SPEC, vpid),
            "bare": (f"http://127.0.0.1:{bport}/items", BARE_BODY, bpid),
        }
        if baseline is not None and "submit" in parts:
            # Its own database: the two share neither SQLite's write lock nor a queue.
            base_url, base_pid = serve(
                baseline, servers.enter_context(database(engine, tmp, "baseline"))
            )
            targets["baseline"] = (f"{base_url}/v1/experiments", SPEC, base_pid)
        for c in connections if "submit" in parts else ():
            for _ in range(2):  # warm each up (first requests pay for imports)
                for target_url, body, _pid in targets.values():
                    wrk(target_url, c, 1, tmp, body)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for _ in range(rounds):  # interleaved, so that each meets the same load
                for name, (target_url, body, pid) in targets.items():
                    runs[name].append(wrk(target_url, c, seconds, tmp, body, pid))
            for name, each in runs.items():
                out[f"{name}_c{c}"] = medians(each)
            report_submit(f"submit/s, {c} connection(s)", out[f"submit_c{c}"], out[f"bare_c{c}"])
            if "baseline" in targets:
                report_submit(
                    f"  baseline {c} connection(s)", out[f"baseline_c{c}"], out[f"bare_c{c}"]
                )
        if "list" not in parts:
            return out
        httpx.post(submit_url, json=SPEC).raise_for_status()  # the row that seeds copy
        seed(url, rows)
        list_url = f"{vramlab_url}/v1/experiments?limit=50"
        wrk(list_url, 1, 1, tmp)
        for key, query, what in (
            ("list", "", "list 50, no filter"),
            ("list_tag", "&tag=t10", "list 50, tag on 1/10"),
            ("list_rare_tag", "&tag=t100", "list 50, tag on 1/100"),
        ):
            out[key] = x = wrk(list_url + query, 1, seconds, tmp)
            print(
                f"{f'{what} of {rows:,}: p95 ms':<36} {x['p95_ms']:10.1f} {'':>10} {'':>7} "
                f"{'<= 50':>9}  (p50 {x['p50_ms']:.1f} ms, {x['non2xx']} non-2xx)"
                + ("  BELOW" if x["p95_ms"] > 50 or x["non2xx"] else ""),
                flush=True,
            )
        out["sweep_s"] = sweep_seconds(vramlab_url)
        print(
            f"{'1,000-point sweep accepted: s':<36} {out['sweep_s']:10.3f} {'':>10} {'':>7} "
            f"{'<= 0.5':>9}" + ("  BELOW" if out["sweep_s"] > 0.5 else ""),
            flush=True,
        )
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One wrk run's figures, or the median of each over several (errors: their sum)."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {"rounds": len(runs)}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if key in ("requests", "non2xx", "socket_errors"):
            out[key] = sum(values)
        else:
            out[key] = statistics.median(values) if values else None
    return out


def python_path(root: Path) -> dict[str, str]:
    """The environment that makes ``python -m app.cli`` import vramlab from ``root``."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    }


def report_submit(what: str, v: dict[str, Any], b: dict[str, Any]) -> None:
    errs = v["non2xx"] + v["socket_errors"]
    cpu = (
        f"  {v['cpu_ms']:.2f} / {b['cpu_ms']:.2f}"
        if v["cpu_ms"] is not None and b["cpu_ms"] is not None
        else ""
    )
    print(
        f"{what:<36} {v['rps']:10.0f} {b['rps']:10.0f} "
        f"{v['rps'] / b['rps']:7.2f} {'>= 0.7':>9}"
        + cpu
        + (f"  ({errs} errors of {v['requests']})" if errs else "")
        + ("  BELOW" if errs or v["rps"] < 0.7 * b["rps"] else ""),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--parts", default="submit,list", help="submit and/or list (+ sweep)")
    parser.add_argument("--connections", default="1,16,64", help="the submit runs' wrk connections")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="submit runs of each server, interleaved; the medians are printed",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another vramlab checkout whose submits are measured in the same run",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/api.py needs wrk (apt-get install wrk)")
    results = {}
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-api-bench-"))
    try:
        for engine in args.engines.split(","):
            results[engine] = run_engine(
                engine,
                args.seconds,
                args.rows,
                tmp,
                set(args.parts.split(",")),
                args.baseline,
                tuple(int(c) for c in args.connections.split(",")),
                args.rounds,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
