"""A small trace with a known peak, uploaded over the worker protocol as a worker would."""

import gzip
import json
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
