"""A small trace with a known peak, uploaded over the worker protocol as a worker would."""

import gzip
import json
import random
from typing import Any

import httpx

from tests.helpers import CUDA_CAPS, MEMORY, claim, register, submit

SEG = 0x7F0000000000
A, B, C, D = SEG, SEG + 4096, SEG + 8192, SEG + 16384
# Where the add op really allocates: its inputs in set-up, its output in the op.
SETUP_FRAMES = [{"filename": "workers/ops/base.py", "line": 66, "name": "two_operands"}]
OP_FRAMES = [{"filename": "workers/ops/elementwise.py", "line": 42, "name": "<lambda>"}]


def events(device: str = "cuda:0") -> list[dict[str, Any]]:
    """Setup makes a and b, the op makes c (the peak: 16 KiB) and frees a, after makes d
    and frees b; c and d are alive at the end, inside the one 2 MiB segment."""
    rows: list[tuple[float, str, int | None, int, str, dict[str, Any]]] = [
        (0, "mark", None, 0, "setup", {"name": "setup"}),
        (1, "segment_alloc", SEG, 2**21, "setup", {}),
        (2, "alloc", A, 4096, "setup", {"frames": SETUP_FRAMES}),
        (3, "alloc", B, 4096, "setup", {}),
        (4, "mark", None, 0, "op", {"name": "op"}),
        (5, "alloc", C, 8192, "op", {"frames": OP_FRAMES}),
        (6, "free_requested", A, 4096, "op", {}),
        (6.5, "free", A, 4096, "op", {}),
        (7, "mark", None, 0, "after", {"name": "after"}),
        (8, "alloc", D, 1024, "after", {}),
        (9, "free_requested", B, 4096, "after", {}),
        (9.5, "free", B, 4096, "after", {}),
    ]
    out = []
    for seq, (t, action, addr, size, phase, extra) in enumerate(rows):
        out.append(
            {
                "seq": seq,
                "t_us": t,
                "action": action,
                "addr": addr,
                "size": size,
                "device": device,
                "stream": 0,
                "phase": phase,
                **extra,
            }
        )
    return out


def many_events(n_pairs: int) -> list[dict[str, Any]]:
    """A CPU-style trace: n allocations of growing size, each freed after the next."""
    out: list[dict[str, Any]] = []
    for i in range(n_pairs):
        out.append({"t_us": 2.0 * i, "action": "alloc", "addr": 1000 + i, "size": 100 + i})
        if i:
            out.append(
                {"t_us": 2.0 * i + 1, "action": "free", "addr": 1000 + i - 1, "size": 99 + i}
            )
    for seq, event in enumerate(out):
        event.update(seq=seq, device="cpu", stream=None, phase="op")
    return out


def gz(rows: list[dict[str, Any]]) -> bytes:
    return gzip.compress(b"".join(json.dumps(e).encode() + b"\n" for e in rows))


def upload(
    client: httpx.Client,
    spec: dict[str, Any],
    chunks: list[list[dict[str, Any]]],
    memory: dict[str, int] | None = None,
    **result: Any,
) -> str:
    """Queue ``spec``, then finish it as a worker would, with ``chunks`` as its trace."""
    exp = submit(client, spec)
    assert complete(client, chunks, memory, **result) == exp["id"]
    exp_id: str = exp["id"]
    return exp_id


def complete(
    client: httpx.Client,
    chunks: list[list[dict[str, Any]]],
    memory: dict[str, int] | None = None,
    **result: Any,
) -> str:
    """Claim the next queued experiment as a two-GPU worker, upload the chunks, succeed."""
    gpus = [{**CUDA_CAPS["gpus"][0], "index": i} for i in range(2)]
    got = claim(client, register(client, {**CUDA_CAPS, "gpus": gpus}))
    assert got is not None
    headers = {"X-Lease-Token": got["lease_token"], "Content-Type": "application/gzip"}
    for seq, chunk in enumerate(chunks):
        url = f"/v1/worker/experiments/{got['id']}/trace/{seq}"
        response = client.put(url, content=gz(chunk), headers=headers)
        assert response.status_code == 200, response.text
    result["memory"] = {**MEMORY, **(memory or {})}
    body = {"lease_token": got["lease_token"], "status": "succeeded", "result": result}
    response = client.post(f"/v1/worker/experiments/{got['id']}/result", json=body)
    assert response.status_code == 200, response.text
    exp_id: str = got["id"]
    return exp_id


def varied_chunks() -> list[list[dict[str, Any]]]:
    """A CUDA trace of five chunks that meets every case of the memory_viz export: allocs,
    frees with and without their free_requested (one across a chunk boundary), segment
    allocs, maps, unmaps and frees, an OOM, marks, an action of no known kind, values of
    unusual JSON types (a float size, a null time, a string stream), frames on some
    events (a free without frames takes its allocation's), and blocks alive at the end
    both inside recorded segments and outside any."""
    rng = random.Random(7)
    seg0, seg1, seg2 = 2**40, 2**40 + 2**24, 2**40 + 2**25
    frames = [[{"filename": "model.py", "line": 10 + i, "name": f"layer{i}"}] for i in range(4)]
    chunks: list[list[dict[str, Any]]] = [[] for _ in range(5)]
    live: list[int] = []
    t = 0.0

    def add(chunk: int, action: str | None, addr: int | None, size: Any, **extra: Any) -> None:
        nonlocal t
        t += rng.random() * 3
        chunks[chunk].append(
            {"t_us": round(t, 3), "action": action, "addr": addr, "size": size, **extra}
        )

    add(0, "mark", None, 0, name="setup")
    add(0, "segment_alloc", seg0, 2**24)
    add(0, "segment_map", seg1, 2**22)
    for i in range(1400):  # more than one pickle batch of entries
        if live and rng.random() < 0.45:
            addr = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                add(0, "free_requested", addr, 512)
            add(0, "free_completed" if i % 3 else "free", addr, 512)
        else:
            addr = seg0 + 512 * i
            live.append(addr)
            add(0, "alloc", addr, 512, stream=0)
    add(0, "oom", None, 2**34)
    add(0, "segment_unmap", seg1 + 2**21, 2**21)
    add(0, "free_requested", live[0], 512)  # its free is in the next chunk
    add(0, "mark", None, 0, name="op")
    add(1, "free", live.pop(0), 512)
    add(1, "alloc", seg2 + 64, 4096.0, stream="0")  # a float size, a string stream
    add(1, "alloc", 2**44, 100, t_us=None)  # outside every segment; no time
    add(1, None, None, 0)
    add(1, "mystery", 5, 7)
    add(1, "free_requested", live[0], 512)  # its free is in the next chunk
    add(2, "segment_alloc", seg2, 2**21, stream=7)
    add(2, "free", live.pop(0), 512)
    add(2, "free", live.pop(0), 512)
    for i in range(300):
        add(2, "alloc", seg1 + 1024 * i, 1024, stream=7)
        if i % 2:
            add(2, "free", seg1 + 1024 * (i - 1), 1024, stream=7)
    add(3, "alloc", seg2 + 8192, 2048, frames=frames[0])
    add(3, "alloc", seg2 + 16384, 2048, frames=frames[1])
    add(3, "free_requested", seg2 + 8192, 2048, frames=frames[2])
    add(3, "free_completed", seg2 + 8192, 2048, frames=frames[2])
    add(3, "segment_free", seg1, 2**21)
    add(3, "alloc", seg1 + 1024 * 150 + 512, 256, frames=frames[3])  # alive, in no segment
    add(4, "free", seg2 + 16384, 2048)  # takes its allocation's frames
    add(4, "alloc", seg2 + 32768, 512)
    add(4, "mark", None, 0, name="after")
    seq = 0
    for chunk in chunks:
        for event in chunk:
            event.setdefault("stream", 0)
            event.update(seq=seq, device="cuda:0", phase="op")
            seq += 1
    return chunks


def churn(n: int, seed: int = 0, first: int = 0) -> list[dict[str, Any]]:
    """A CUDA trace's plain events, about 130 bytes a line as a worker writes them:
    addresses that live, die and live again, frees with and without their request,
    segments that come and go, marks, an OOM; and the odd values a plain event may have
    (a null address on an allocation, a null size, stream or time, a float time, a
    negative or very large time, an empty frames list)."""
    rnd = random.Random(seed)
    live: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    t = 0.0
    while len(rows) < n:
        t += rnd.random() * 3
        addr = 0x7F0000000000 + 4096 * rnd.randrange(400)
        r = rnd.random()
        if r < 0.03:
            action, size = rnd.choice(["segment_alloc", "segment_free", "segment_map"]), 2**21
        elif r < 0.04:
            action, size = rnd.choice(["mark", "oom", "segment_unmap"]), 0
        elif addr in live:
            size = live.pop(addr)
            if rnd.random() < 0.5:
                rows.append({"t_us": round(t, 3), "action": "free_requested", "addr": addr})
                rows[-1]["size"] = size
            action = rnd.choice(["free_completed", "free"])
        else:
            action, size = "alloc", live.setdefault(addr, rnd.choice([512, 4096, 2**20]))
        rows.append({"t_us": round(t, 3), "action": action, "addr": addr, "size": size})
    rows = rows[:n]
    for i, row in enumerate(rows):
        row.update(seq=first + i, device="cuda:0", stream=rnd.choice([0, 0, 0, 7]), phase="op")
    odd = [
        {"action": "alloc", "addr": None},
        {"size": None},
        {"stream": None},
        {"t_us": None},
        {"t_us": 12},
        {"t_us": -3.75},
        {"t_us": 2**53 - 1},
        {"frames": []},
        {"frames": None, "pre_trace": None},
    ]
    for k, change in enumerate(odd):
        rows[(k + 1) * n // (len(odd) + 2)].update(change)
    return rows
