"""What of its GPU a PyTorch process can use: the card's total memory, what is free once
CUDA has started (the context and what the driver keeps gone), the largest single
reservation the caching allocator then gets, what cuBLAS's handles add beside their
workspaces (which the allocator holds), and the most the allocator can reserve in all
after a training step's first matmuls (forward and backward threads) — the usable bytes
of the card, on the scale of ``capacity_bytes``. Every figure is read in a fresh
process. On a CUDA host:

    python -m bench.usable_memory [--out DIR]

Prints one JSON object (also written to DIR/usable_memory.json) and a table. With
``--card NAME`` (a card of app/gpus/cards.json, e.g. "H100 SXM 80GB" or "H200 141GB") it
also writes the card's measured total and usable bytes into that catalog (its
``usable_source`` becomes ``measured``), the figures GET /v1/gpus and plans then use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MiB = 2**20
GiB = 2**30
STEP = 2 * MiB  # cudaMalloc's granularity and the allocator's rounding of large segments


def _largest(torch: Any, device: Any, low: int, high: int) -> int:
    """The largest single block the allocator can add now (bisection, 2 MiB steps)."""
    while high - low > STEP:
        mid = (low + high) // 2 // STEP * STEP
        try:
            block = torch.empty(mid, dtype=torch.uint8, device=device)
        except torch.cuda.OutOfMemoryError:
            high = mid
        else:
            del block
            low = mid
        torch.cuda.empty_cache()
    return low


def _filled(torch: Any, device: Any) -> int:
    """Bytes the allocator reserves when it keeps asking for segments, largest first
    (1 GiB, then 20 MiB, then 2 MiB) until the driver refuses."""
    held = []
    for size in (GiB, 20 * MiB, 2 * MiB):
        while True:
            try:
                held.append(torch.empty(size, dtype=torch.uint8, device=device))
            except torch.cuda.OutOfMemoryError:
                break
    reserved = int(torch.cuda.memory_reserved(device))
    del held
    torch.cuda.empty_cache()
    return reserved


def probe(kind: str) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import torch

    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.init()
    torch.empty(1, device=device)  # the context and the allocator started: 2 MiB reserved
    free, _ = torch.cuda.mem_get_info(device)
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "total": total,
        "free_after_init": free,
        "reserved_after_init": torch.cuda.memory_reserved(device),
    }
    if kind == "largest":
        out["largest_reservation"] = _largest(torch, device, 0, free + STEP)
    elif kind == "filled":
        out["filled"] = _filled(torch, device)
    elif kind == "cublas":
        before_free = torch.cuda.mem_get_info(device)[0]
        before_reserved = torch.cuda.memory_reserved(device)
        a = torch.ones(64, 64, device=device)
        (a @ a).sum().item()  # the main thread's cuBLAS handle and workspace
        free1 = torch.cuda.mem_get_info(device)[0]
        reserved1 = torch.cuda.memory_reserved(device)
        w = torch.ones(64, 64, device=device, requires_grad=True)
        (w @ w).sum().backward()  # autograd's thread: a second handle and workspace
        torch.cuda.synchronize()
        free2 = torch.cuda.mem_get_info(device)[0]
        reserved2 = torch.cuda.memory_reserved(device)
        out.update(
            main_workspace_reserved=reserved1 - before_reserved,
            main_handle_outside_allocator=(before_free - free1) - (reserved1 - before_reserved),
            autograd_workspace_reserved=reserved2 - reserved1,
            autograd_handle_outside_allocator=(free1 - free2) - (reserved2 - reserved1),
            free_after_both_handles=free2,
            reserved_after_both_handles=reserved2,
        )
        # Then what the allocator can hold in all: what it has plus the most it adds.
        out["usable_for_training"] = reserved2 + _largest(torch, device, 0, free2 + STEP)
        out["usable_for_training_filled"] = _filled(torch, device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--probe", choices=["largest", "filled", "cublas"], help=argparse.SUPPRESS)
    parser.add_argument("--card", help="write the figures into app/gpus/cards.json's card")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return
    figures: dict[str, Any] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in ("largest", "filled", "cublas"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.usable_memory", "--probe", kind],
            capture_output=True,
            text=True,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines or not lines[-1].startswith("{"):
            figures.setdefault("errors", {})[kind] = (done.stderr or done.stdout)[-2000:]
        else:
            figures.update(json.loads(lines[-1]))
        # written after every probe: what was measured survives a later probe's failure
        (args.out / "usable_memory.json").write_text(json.dumps(figures, indent=1))
    if "errors" in figures:
        print(json.dumps(figures["errors"], indent=1), file=sys.stderr)
        raise SystemExit(1)
    total = figures["total"]
    figures["context_and_driver"] = (
        total - figures["free_after_init"] - figures["reserved_after_init"]
    )
    (args.out / "usable_memory.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    print()
    print(f"{figures['gpu']}, torch {figures['torch']}")
    print("| figure | bytes | GiB | of total |")
    print("| --- | --- | --- | --- |")
    if args.card:
        print(_write_card(args.card, figures))
    for name in (
        "total",
        "free_after_init",
        "context_and_driver",
        "largest_reservation",
        "filled",
        "main_workspace_reserved",
        "main_handle_outside_allocator",
        "autograd_workspace_reserved",
        "autograd_handle_outside_allocator",
        "usable_for_training",
        "usable_for_training_filled",
    ):
        value = figures[name]
        print(f"| {name} | {value} | {value / GiB:.3f} | {value / total:.2%} |")


def _write_card(name: str, figures: dict[str, Any]) -> str:
    """Put the measured total and usable bytes into the GPU catalog's card ``name``."""
    path = Path(__file__).resolve().parents[1] / "app" / "gpus" / "cards.json"
    data = json.loads(path.read_text())
    card = next((c for c in data["cards"] if c["name"] == name), None)
    if card is None:
        names = ", ".join(c["name"] for c in data["cards"])
        raise SystemExit(f"no card {name!r} in {path}; there are: {names}")
    card["total_bytes"] = figures["total"]
    card["usable_bytes"] = figures["usable_for_training_filled"]  # bench/fit_edge's card
    card["usable_source"] = "measured"
    card["source"] = (
        f"measured with python -m bench.usable_memory on {figures['gpu']}, torch "
        f"{figures['torch']}: total, and usable_for_training_filled (what the caching "
        "allocator reserved in all, segment after segment, once the CUDA context and both "
        "cuBLAS handles were up)"
    )
    path.write_text(json.dumps(data, indent=1) + "\n")
    usable = figures["usable_for_training_filled"]
    return f"{path}: {name} total {figures['total']}, usable {usable}"


if __name__ == "__main__":
    main()
