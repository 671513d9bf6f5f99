"""Import a large synthetic PyTorch memory snapshot into a live vramlab API and report
what it cost: time to the summary, and the API's and the parser child's peak memory.

    python bench/snapshot_import.py --size-mib 1024 [--frames 60] [--keep FILE] [--use FILE]
                                    [--parser | --parser-only] [--pickler]

The snapshot is written by hand, opcode by opcode, as PyTorch's own pickle looks: one
dict per trace entry, a new frames list per entry whose frame dicts are shared (so the
pickle refers back to them), about ``--frames`` frames a stack as with stacks="all". The
trace is a training loop (forward, backward, an Adam-like step, zero_grad), so the
summary has every category. Then ``vramlab serve`` starts on a temporary SQLite file and
the file is POSTed (streamed) to /v1/snapshots; /proc gives each process's peak RSS.

With ``--pickler`` the file is what PyTorch's ``pickle.dump`` writes instead
(``snapshot_memoized``: protocol 4, every entry's dict, frames list and ``compile_context``
memoized, as the unpickler's memo then keeps them; use ``--frames 8`` for entries as
dense as ``stacks="python"`` ones, about 80 bytes each).

With ``--parser``, before that, the parser child alone (``python -m app.snapshots.parse``)
reads the same file twice in the same run: as it does (the trace streamed) and with
``--whole`` (unpickled whole, as before the stream reader), each with its wall and CPU
seconds and peak RSS against the file's size. ``--parser-only`` stops there.
"""

import argparse
import contextlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import snapshot_memoized

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
BASE = 0x7F0000000000
FRAME_MEMO = 1000  # memo indexes of the shared frame dicts start here


def _body(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=2)[2:-1]


def _int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


class Writer:
    def __init__(self, frames: int) -> None:
        self.keys = {
            k: _body(k)
            for k in (
                "action",
                "addr",
                "size",
                "stream",
                "time_us",
                "frames",
                "compile_context",
                "user_metadata",
            )
        }
        self.actions = {
            a: _body(a) for a in ("alloc", "free_requested", "free_completed", "segment_alloc")
        }
        self.empty = _body("")
        self.pool: list[dict[str, object]] = []
        self.stacks = {
            name: self._stack(name, frames)
            for name in ("to", "fwd", "bwd", "opt", "opt_tmp", "zero", "data")
        }
        self.t = 1_700_000_000_000_000

    def _frame(self, filename: str, line: int, name: str) -> int:
        self.pool.append({"filename": filename, "line": line, "name": name})
        return len(self.pool) - 1

    def _stack(self, kind: str, depth: int) -> bytes:
        specific = {
            "to": [
                ("torch/nn/modules/module.py", 1341, "convert"),
                ("torch/nn/modules/module.py", 942, "_apply"),
                ("torch/nn/modules/module.py", 1355, "to"),
            ],
            "fwd": [
                ("torch/nn/modules/linear.py", 134, "forward"),
                ("torch/nn/modules/module.py", 1790, "_call_impl"),
            ],
            "bwd": [
                ("", 0, "torch::autograd::Engine::evaluate_function(...)"),
                ("", 0, "torch::autograd::Engine::thread_main(...)"),
            ],
            "opt": [
                ("torch/optim/adam.py", 160, "_init_group"),
                ("torch/optim/adam.py", 230, "step"),
            ],
            "opt_tmp": [
                ("torch/optim/adam.py", 600, "_multi_tensor_adam"),
                ("torch/optim/adam.py", 230, "step"),
            ],
            "zero": [("torch/optim/optimizer.py", 990, "zero_grad")],
            "data": [("train.py", 30, "batch")],
        }[kind]
        ids = [self._frame(f, ln, n) for f, ln, n in specific]
        ids += [self._frame("", 0, f"c10::{kind}::frame{i}(...)") for i in range(depth - len(ids))]
        gets = b"".join(b"j" + struct.pack("<I", FRAME_MEMO + i) for i in ids)
        return b"](" + gets + b"e"

    def pool_bytes(self) -> bytes:
        """The shared frame dicts, each put in the memo where the stacks get it."""
        parts = [b"]("]
        for i, frame in enumerate(self.pool):
            parts.append(_body(frame) + b"r" + struct.pack("<I", FRAME_MEMO + i))
        return b"".join(parts) + b"e"

    def entry(self, action: str, addr: int, size: int, stack: str) -> bytes:
        self.t += 3
        k = self.keys
        return b"".join(
            (
                b"}(",
                k["action"],
                self.actions[action],
                k["addr"],
                _int(addr),
                k["size"],
                _int(size),
                k["stream"],
                b"K\x00",
                k["time_us"],
                _int(self.t),
                k["compile_context"],
                self.empty,
                k["user_metadata"],
                self.empty,
                k["frames"],
                self.stacks[stack],
                b"u",
            )
        )


def training(w: Writer, target: int) -> Iterator[bytes]:
    """Entries of a training loop until about ``target`` bytes have been written."""
    layers, param, act = 8, 4 * MiB, 16 * MiB
    written = 0
    next_addr = BASE
    free: dict[int, list[int]] = {}

    def alloc(size: int, stack: str) -> tuple[int, bytes]:
        nonlocal next_addr
        if free.get(size):
            addr = free[size].pop()
        else:
            addr, next_addr = next_addr, next_addr + size
        return addr, w.entry("alloc", addr, size, stack)

    def release(addr: int, size: int, stack: str) -> bytes:
        free.setdefault(size, []).append(addr)
        return w.entry("free_requested", addr, size, stack) + w.entry(
            "free_completed", addr, size, stack
        )

    yield w.entry("segment_alloc", BASE, 2**36, "to")
    params = []
    for _ in range(layers):
        addr, data = alloc(param, "to")
        params.append(addr)
        yield data
    state: list[int] = []
    step = 0
    while written < target:
        out = []
        x, data = alloc(act, "data")
        out.append(data)
        acts = []
        for _ in range(layers):
            a, data = alloc(act, "fwd")
            acts.append(a)
            out.append(data)
            t, data = alloc(act // 4, "fwd")
            out += [data, release(t, act // 4, "fwd")]
        grads = []
        for a in reversed(acts):
            g, data = alloc(param, "bwd")
            grads.append(g)
            out.append(data)
            t, data = alloc(act // 2, "bwd")
            out += [data, release(t, act // 2, "bwd"), release(a, act, "bwd")]
        if step == 0:
            for _ in range(2 * layers):
                s_, data = alloc(param, "opt")
                state.append(s_)
                out.append(data)
        for _ in range(4):
            t, data = alloc(param, "opt_tmp")
            out += [data, release(t, param, "opt_tmp")]
        out += [release(g, param, "zero") for g in grads]
        out.append(release(x, act, "data"))
        chunk = b"".join(out)
        written += len(chunk)
        step += 1
        yield chunk


def write_snapshot(path: Path, size_mib: int, frames: int) -> int:
    """The file, streamed: {"vramlab_bench_frames": [...], "segments": [],
    "device_traces": [[entries...]], "allocator_settings": {}}. Returns entries written."""
    w = Writer(frames)
    entries = 0
    with path.open("wb") as f:
        f.write(b"\x80\x02}(" + _body("vramlab_bench_frames") + w.pool_bytes())
        f.write(_body("segments") + b"]" + _body("device_traces") + b"]]")
        batch: list[bytes] = []
        for chunk in training(w, size_mib * MiB):
            entries += chunk.count(b"}(")
            batch.append(chunk)
            if len(batch) >= 200:
                f.write(b"(" + b"".join(batch) + b"e")
                batch = []
        if batch:
            f.write(b"(" + b"".join(batch) + b"e")
        f.write(b"a" + _body("allocator_settings") + b"}u.")
    return entries


def parser_alone(snap: Path, whole: bool, tmp: Path) -> dict[str, float]:
    """The parser child on ``snap``, as the API runs it: wall and CPU seconds, peak RSS."""
    out = tmp / ("parse-whole" if whole else "parse-stream")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), str(ROOT / "client"), os.environ.get("PYTHONPATH")) if p
        ),
    }
    command = [sys.executable, "-m", "app.snapshots.parse", str(snap), str(out)]
    t0 = time.monotonic()
    child = subprocess.Popen([*command, *(["--whole"] if whole else [])], env=env, cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - t0
    result = json.loads((out / "result.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    if status != 0 or not result.get("ok"):
        raise RuntimeError(f"the parser failed: {status} {str(result)[:300]}")
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss * 1024,
        "entries": result["summary"]["entries"],
    }


def _rss_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


class Watch(threading.Thread):
    """Samples the API's children (the parser) for their largest RSS."""

    def __init__(self, api: int) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.child_peak_kib = 0
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            for child in _children(self.api):
                self.child_peak_kib = max(self.child_peak_kib, _rss_kib(child, "VmHWM"))
            time.sleep(0.1)


def _stream(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(MiB):
            yield block


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=60, help="frames a stack")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--keep", type=Path, help="keep the snapshot file here")
    parser.add_argument("--use", type=Path, help="a snapshot file already written")
    parser.add_argument("--parser", action="store_true", help="the parser alone, both ways")
    parser.add_argument("--parser-only", action="store_true", help="that, and not the API")
    parser.add_argument(
        "--pickler", action="store_true", help="the file as pickle.dump writes it (memoized)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-snap-"))
    snap = args.use or args.keep or tmp / "snapshot.pickle"
    if args.use is None:
        t0 = time.monotonic()
        if args.pickler:
            entries = snapshot_memoized.to_path(
                snap, args.frames, lambda w: training(w, args.size_mib * MiB)
            )
        else:
            entries = write_snapshot(snap, args.size_mib, args.frames)
        print(
            f"wrote {snap.stat().st_size / MiB:.0f} MiB, {entries} entries, in "
            f"{time.monotonic() - t0:.1f} s"
        )
    size = snap.stat().st_size
    if args.parser or args.parser_only:
        print(f"{'parser alone':<22} {'wall s':>7} {'CPU s':>6} {'peak RSS':>9} {'x file':>7}")
        for whole in (False, True):
            run = parser_alone(snap, whole, tmp)
            name = "whole file (--whole)" if whole else "streamed"
            print(
                f"{name:<22} {run['wall']:>7.1f} {run['cpu']:>6.1f} "
                f"{run['rss'] / MiB:>6.0f}MiB {run['rss'] / size:>7.2f}"
            )
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.parser_only:
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    log = (tmp / "api.log").open("wb")
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            str(args.port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(900, connect=5)) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.get("/healthz").raise_for_status()
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"API did not start; see {tmp / 'api.log'}") from None
                    time.sleep(0.2)
            idle_kib = _rss_kib(api.pid, "VmRSS")
            watch = Watch(api.pid)
            watch.start()
            t1 = time.monotonic()
            response = client.post(
                "/v1/snapshots",
                params={"name": f"bench {args.size_mib} MiB"},
                content=_stream(snap),
                headers={"Content-Type": "application/octet-stream"},
            )
            took = time.monotonic() - t1
            watch.stop = True
            watch.join()
            if response.status_code != 201:
                print(f"import failed: {response.status_code} {response.text[:500]}")
                return 1
            out = response.json()
            t2 = time.monotonic()
            client.get(f"/v1/snapshots/{out['id']}").raise_for_status()
            read_s = time.monotonic() - t2
            t3 = time.monotonic()
            client.get(f"/v1/snapshots/{out['id']}/timeline").raise_for_status()
            timeline_s = time.monotonic() - t3
            api_peak = _rss_kib(api.pid, "VmHWM")
        db_mib = (tmp / "bench.db").stat().st_size / MiB
        print(
            f"{'snapshot':>10} {'entries':>9} {'import s':>9} {'MB/s':>6} "
            f"{'API idle':>9} {'API peak':>9} {'parser peak':>11} {'db':>7} {'GET s':>6}"
        )
        print(
            f"{size / MiB:>7.0f}MiB {out['entries']:>9} {took:>9.1f} {size / 1e6 / took:>6.1f} "
            f"{idle_kib / 1024:>6.0f}MiB {api_peak / 1024:>6.0f}MiB "
            f"{watch.child_peak_kib / 1024:>8.0f}MiB {db_mib:>4.0f}MiB {read_s:>6.2f}"
        )
        cost = out["import"]
        print(
            f"parser: {cost['parse_wall_s']:.1f} s wall, {cost['parse_cpu_s']:.1f} s CPU; "
            f"upload and store: {took - cost['parse_wall_s']:.1f} s; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(f"timeline page: {timeline_s:.2f} s")
        cats = {c["category"]: c["bytes"] // MiB for c in out["categories"]}
        print(f"peak {out['memory']['allocated_peak'] // MiB} MiB; by category (MiB): {cats}")
    finally:
        api.terminate()
        api.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
