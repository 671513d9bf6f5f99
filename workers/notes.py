"""Plain-language notes: what was measured against what the catalog predicted, and why.

Each note names its figures so a reader can check it against the result. Predictions
are the catalog's (tensor bytes after the CUDA allocator's 512-byte rounding).
"""

from __future__ import annotations

from typing import Any

from vramlab.contract import SHARED_PROCESS_FIGURES, ErrorType, MemoryFigures, Prediction
from vramlab.runspec import RunSpec
from workers import explain
from workers.tracer import Event

MiB = 2**20
SMALL_BLOCK = MiB  # the caching allocator serves blocks up to 1 MiB from 2 MiB segments


def write(
    spec: RunSpec,
    result: dict[str, Any],
    mem: MemoryFigures,
    events: list[Event],
    error: dict[str, Any] | None,
    init_rss: tuple[int, int] | None = None,
    runs_before: int | None = None,
) -> list[str]:
    """Notes on ``result``, whose figures are ``mem``; ``runs_before`` says how many
    experiments a shared process ran before this one (None: a clean process)."""
    cuda = spec.device.startswith("cuda")
    return _body_notes(spec, result, mem, events, error, init_rss, cuda) + _shared_notes(
        runs_before, cuda, mem
    )


def _body_notes(
    spec: RunSpec,
    result: dict[str, Any],
    mem: MemoryFigures,
    events: list[Event],
    error: dict[str, Any] | None,
    init_rss: tuple[int, int] | None,
    cuda: bool,
) -> list[str]:
    pred = spec.prediction
    notes: list[str] = []
    if error is not None:
        phases = result["phases"] or result.get("steps") or []
        phase = phases[-1]["name"] if phases else "start"
        notes.append(
            f"The experiment failed ({error['type']}) in phase {phase}; the figures "
            f"are those at that moment."
        )
        asked = error["details"].get("requested_bytes")
        if error["type"] in (ErrorType.OOM, ErrorType.MEMORY_LIMIT) and asked is not None:
            rounded = error["details"].get("requested_is_approximate")
            notes.append(
                f"PyTorch asked for {asked:,} bytes"
                f"{' (as the message rounds it)' if rounded else ''} with "
                f"{mem.allocated_after:,} allocated and {mem.reserved_after:,} reserved."
            )
        notes += explain.extra(spec, result, error)
        if spec.is_scenario:
            notes += explain.scenario(result, cuda)
        return notes + (_context_notes(mem, init_rss) if cuda else [])
    if spec.is_scenario:
        notes += explain.scenario(result, cuda)
    elif not spec.is_model:  # a model's prediction is its step's peak (models/report.py)
        notes += _prediction_notes(spec, result, mem, events, pred, cuda)
    notes += _pool_notes(spec, mem, cuda)
    notes += explain.extra(spec, result, error)
    notes += _transfer_notes(spec, result, mem)
    if cuda:
        notes += _context_notes(mem, init_rss)
    else:
        notes.append(
            "CPU timings were taken with the profiler recording memory events, "
            "which adds a little time to each allocation."
        )
    return notes


def _shared_notes(runs_before: int | None, cuda: bool, mem: MemoryFigures) -> list[str]:
    """What a shared process's figures share with a clean process's, and what they do not:
    which figures are shared-process figures, then the whole comparison."""
    if runs_before is None:
        return []
    if runs_before == 0:
        return [
            "Run in a shared process (isolation shared), the first it ran: it started as a "
            "clean one does, and stays to serve later shared experiments."
        ]
    earlier = f"{runs_before} experiment{'s' if runs_before != 1 else ''}"
    if cuda:
        same = (
            "the caching allocator was empty (allocated and reserved 0, every cached segment "
            "given back to the driver), its peak and accumulated statistics reset, cuBLAS's "
            "workspaces freed (a first matmul allocates one again), pinned host blocks given "
            "back, the allocation history empty and the random generators reset"
        )
        other = (
            "CUDA kernels already loaded, cuDNN and cuBLAS handles and plans made earlier, "
            "the CUDA context made before this experiment (its start-up and its host memory "
            "are in no figure here), and host RSS, which starts from what the earlier "
            "experiments left (device-level used memory also counts the loaded kernels)"
        )
    else:
        same = (
            "the profiler started afresh (allocated counts this experiment's events alone), "
            "the byte cap was applied anew, and the random generators were reset"
        )
        other = (
            "libraries and their thread pools already started, and host RSS, which starts "
            "from what the earlier experiments left"
        )
    growth = mem.host_rss_after - mem.host_rss_before
    figures = " and ".join(str(f) for f in SHARED_PROCESS_FIGURES)
    return [
        f"Shared-process figures: {figures} ({mem.host_rss_before:,} and "
        f"{mem.host_rss_after:,} bytes, a change of {growth:+,}) start from what the "
        f"{earlier} before this one left in the process, so the same experiment gives "
        f"other values at another place in the sequence or in a clean process (isolation "
        f"clean). The allocated and reserved figures do not: they are counted afresh for "
        f"each experiment.",
        f"Run in a shared process (isolation shared) that had run {earlier} before this "
        f"one. As in a clean process: {same}. Not as in a clean process: {other}.",
    ]


def _prediction_notes(
    spec: RunSpec,
    result: dict[str, Any],
    mem: MemoryFigures,
    events: list[Event],
    pred: Prediction | None,
    cuda: bool,
) -> list[str]:
    notes: list[str] = []
    if pred is None:
        return notes
    before, pred_before = mem.allocated_before, pred.allocated_before
    if before == pred_before:
        notes.append(f"allocated_before is {before:,} bytes, as predicted: the inputs.")
    else:
        notes.append(
            f"allocated_before is {before:,} bytes; the prediction was "
            f"{pred_before:,} ({before - pred_before:+,})."
        )
    delta, pred_delta = mem.delta_allocated, pred.delta_allocated
    outputs = ", ".join(f"{o.name} {o.shape} {o.dtype}" for o in pred.outputs)
    if delta == pred_delta:
        notes.append(
            f"delta_allocated is {delta:,} bytes, exactly the prediction"
            f"{f' ({outputs})' if outputs else ''}."
        )
    elif delta > pred_delta:
        extra = delta - pred_delta
        kept = _kept_beyond_outputs(events, result["outputs"], cuda)
        seen = (
            f" The trace shows it: allocations of {', '.join(f'{k:,}' for k in kept)} bytes "
            f"made during the op and never freed."
            if kept
            else ""
        )
        if cuda and spec.op == "matmul":
            notes.append(
                f"delta_allocated is {delta:,} bytes, {extra:,} ({extra / MiB:.2f} MiB) more than "
                f"predicted: cuBLAS's workspace. On the first cuBLAS call in a process PyTorch "
                f"allocates the workspace through the caching allocator and keeps it for the "
                f"life of the cuBLAS handle, so it stays allocated after the op (its size "
                f"follows CUBLAS_WORKSPACE_CONFIG and the GPU).{seen}"
            )
        else:
            why = (
                "what autograd saved for backward, kept alive by the output's graph"
                if (result.get("details") or {}).get("categories", {}).get("activations_saved")
                else "a library workspace, a cache, or state the op keeps (see details)"
            )
            notes.append(
                f"delta_allocated is {delta:,} bytes, {extra:,} more than predicted: "
                f"memory the op kept beyond its outputs ({why}).{seen}"
            )
    else:
        notes.append(
            f"delta_allocated is {delta:,} bytes, {pred_delta - delta:,} less than predicted."
        )
    if any(o["is_view_of_input"] for o in result["outputs"]):
        notes.append(
            "An output shares storage with an input (a view, or the input itself), "
            "so it takes no new bytes."
        )
    peak, after = mem.allocated_peak, mem.allocated_after
    if peak > after:
        notes.append(
            f"During the op allocated peaked at {peak:,} bytes, {peak - after:,} above "
            f"what stayed: temporaries freed before the op returned. (Each repeat's "
            f"previous output was freed before the next call, so the peak is one "
            f"call's.)"
        )
    return notes


def _pool_notes(spec: RunSpec, mem: MemoryFigures, cuda: bool) -> list[str]:
    if not cuda:
        return [
            "On the CPU there is no caching allocator: reserved is reported equal to "
            "allocated, and both are the running total of the profiler's allocation events "
            "since set-up began (the bytes PyTorch asked for; the OS may map more)."
        ]
    reserved, allocated = mem.reserved_after, mem.allocated_after
    if reserved <= allocated:
        return []
    expandable = bool(spec.allocator.expandable_segments)
    how = (
        "with expandable_segments it maps memory into growing segments in 2 MiB pages"
        if expandable
        else f"blocks up to {SMALL_BLOCK // 1024} KiB come from 2 MiB segments, blocks up to "
        f"10 MiB from 20 MiB segments, larger ones from segments rounded up to 2 MiB"
    )
    return [
        f"reserved_after ({reserved:,}) exceeds allocated_after ({allocated:,}) by "
        f"{reserved - allocated:,} bytes: the caching allocator takes memory from the "
        f"driver in segments ({how}) and keeps freed blocks cached for reuse."
    ]


def _transfer_notes(spec: RunSpec, result: dict[str, Any], mem: MemoryFigures) -> list[str]:
    if spec.op != "to":
        return []
    timing = result.get("timing") or {}
    notes: list[str] = []
    if not result["outputs"] or all(o["is_view_of_input"] for o in result["outputs"]):
        notes.append(
            "Tensor.to with the same device and dtype (and copy=False) returns the "
            "source tensor itself: no copy, no new bytes."
        )
    if spec.pin_memory:
        notes.append(
            "The source is in page-locked (pinned) host memory from PyTorch's pinned "
            "host allocator, which caches blocks like the CUDA allocator: the copy can "
            "be asynchronous (non_blocking) and runs at the link's full rate."
        )
    elif spec.non_blocking and spec.source_device == "cpu":
        notes.append(
            "non_blocking=True from pageable memory: the driver still stages the copy "
            "through its own pinned buffers, so it is not truly asynchronous."
        )
    growth = mem.host_rss_after - mem.host_rss_before
    if abs(growth) >= MiB:
        notes.append(
            f"Host RSS changed by {growth:+,} bytes during the op: host memory touched "
            f"by the copy (staging buffers, a CPU destination, or pages first used)."
        )
    if timing.get("bytes_per_s"):
        notes.append(
            f"Median bandwidth {timing['bytes_per_s'] / 1e9:.2f} GB/s (source bytes / median time)."
        )
    return notes


def _context_notes(mem: MemoryFigures, init_rss: tuple[int, int] | None) -> list[str]:
    notes: list[str] = []
    used, reserved = mem.device_used_after, mem.reserved_after
    if used is not None and used > reserved:
        notes.append(
            f"Device-level used memory (total - free from cudaMemGetInfo) is {used:,} "
            f"bytes, {used - reserved:,} more than PyTorch reserved: the CUDA context "
            f"(kernels, runtime state), library handles and any other process on this "
            f"GPU. None of it shows in allocated."
        )
    if init_rss is not None and init_rss[1] > init_rss[0]:
        notes.append(
            f"Starting CUDA in this process raised host RSS by "
            f"{init_rss[1] - init_rss[0]:,} bytes (driver, runtime and kernels)."
        )
    return notes


def _kept_beyond_outputs(
    events: list[Event], outputs: list[dict[str, Any]], cuda: bool
) -> list[int]:
    """Sizes of blocks allocated during the op and still live at the end, outputs aside."""
    live: dict[int, tuple[int, str]] = {}
    for event in events:
        if event["action"] == "alloc" and event["addr"] is not None:
            live[event["addr"]] = (event["size"], event["phase"])
        elif event["action"] in ("free_requested", "free") and event["addr"] is not None:
            live.pop(event["addr"], None)
    sizes = sorted(size for size, phase in live.values() if phase == "op")
    for out in outputs:
        # CUDA's history gives the requested size; some versions give the rounded block.
        for size in (out["bytes"], -(-out["bytes"] // 512) * 512):
            if size in sizes:
                sizes.remove(size)
                break
    return sizes
