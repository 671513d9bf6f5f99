"""Notes for the phenomena beyond one op's bytes: autograd, modules, views, layouts,
placement and copies, device mismatch, dtype support, scenarios and the allocator backend.

notes.py calls ``extra`` after its own notes on the prediction and the pool.
"""

from __future__ import annotations

from typing import Any

from vramlab.contract import ErrorType
from vramlab.runspec import RunSpec

MiB = 2**20


def extra(spec: RunSpec, result: dict[str, Any], error: dict[str, Any] | None) -> list[str]:
    details = result.get("details") or {}
    out: list[str] = []
    out += _caveats(result)
    out += _autograd(details)
    out += _modules(details)
    out += _views(spec, result)
    out += _placement(spec, result.get("placement") or {})
    out += _dtype_support(details)
    out += _mismatch(spec, details, error)
    out += _backend(result)
    if details.get("numpy"):
        out.append(
            "The source array was allocated by NumPy (row-major, shared with the tensor by "
            "torch.from_numpy, no copy): PyTorch's CPU allocator never saw it, so CPU "
            "allocated figures leave it out; host RSS counts it. Row-major is PyTorch's own "
            "contiguous layout: nothing about it stops a move to the GPU."
        )
    return out


def _caveats(result: dict[str, Any]) -> list[str]:
    pred = result.get("prediction") or {}
    if not pred.get("caveats"):
        return []
    return [f"Not predicted exactly: {'; '.join(pred['caveats'])}."]


def _autograd(details: dict[str, Any]) -> list[str]:
    saved = details.get("autograd")
    sections = details.get("sections") or {}
    notes = []
    if saved:
        notes.append(
            f"Autograd saved {saved['tensors_saved']} tensor(s) for backward; "
            f"{saved['new_bytes_saved']:,} bytes of them are new storages (not the inputs): "
            f"they live until backward frees the graph."
        )
    back = sections.get("backward")
    if back:
        notes.append(
            f"Backward (last call): allocated went {back['allocated_start']:,} -> "
            f"{back['allocated_end']:,} bytes, peaking at {back['allocated_peak']:,} "
            f"(gradients and backward's temporaries)."
        )
    return notes


def _modules(details: dict[str, Any]) -> list[str]:
    cat = details.get("categories")
    if not cat:
        return []
    note = (
        f"By category (counted from live tensors): parameters {cat['parameters']:,}, "
        f"gradients {cat['gradients']:,}, optimizer state {cat['optimizer_state']:,}, "
        f"activations saved for backward {cat['activations_saved']:,}, output {cat['outputs']:,} "
        f"bytes."
    )
    notes = [note]
    if cat["outputs"] and cat["activations_saved"]:
        notes.append(
            "The output was kept without torch.no_grad(): it holds the autograd graph, so "
            "the activations saved for backward stay allocated with it (delta_allocated "
            "includes them). Under no_grad only the output would stay."
        )
    if cat.get("optimizer_state_on_cpu"):
        notes.append(
            f"{cat['optimizer_state_on_cpu']:,} bytes of optimizer state (Adam's step "
            f"counters) live on the CPU even though the model is on the GPU."
        )
    return notes


def _views(spec: RunSpec, result: dict[str, Any]) -> list[str]:
    notes = []
    for out in result.get("outputs") or []:
        storage = out.get("storage_bytes")
        if storage and storage > out["bytes"]:
            notes.append(
                f"Output {out['name']} is a view of {out['bytes']:,} bytes whose storage is "
                f"{storage:,} bytes: a view keeps its whole base alive. Clone the slice to let "
                f"the base go."
            )
        if out.get("layout") == "channels_last":
            notes.append(
                "channels_last keeps the shape and changes the strides (NHWC in memory): a "
                "full copy, the same bytes."
            )
        if out.get("layout") == "sparse_coo":
            notes.append(
                f"The sparse COO tensor holds {out['bytes']:,} bytes: int64 indices "
                f"[ndim, nnz] plus values; dense would be smaller above about "
                f"1/(1 + 8*ndim/itemsize) density."
            )
    return notes


def _placement(spec: RunSpec, placement: dict[str, Any]) -> list[str]:
    notes = []
    for copy in placement.get("host_device_copies") or []:
        expected = spec.op in ("to", "scenario")
        notes.append(
            f"{copy['op']} copied {copy['bytes']:,} bytes {copy['from']} -> {copy['to']} in "
            f"{copy['calls']} call(s)"
            + (
                " (the transfer asked for)."
                if expected
                else ": an implicit host-device copy inside the op."
            )
        )
    cpu_ops = placement.get("cpu_ops_in_cuda_experiment") or {}
    if cpu_ops and not spec.is_scenario:
        names = ", ".join(list(cpu_ops)[:6])
        notes.append(
            f"Work ran on the CPU in a CUDA experiment ({names}): a tensor or parameter left "
            f"on the CPU, silently computed there."
        )
    scalar_ops = placement.get("host_scalar_ops") or {}
    if scalar_ops:
        names = ", ".join(list(scalar_ops)[:6])
        notes.append(
            f"Some bookkeeping ran on the CPU on 0-dim tensors ({names}): scalar state that "
            f"PyTorch keeps on the host by design (Adam's step counters, say, unless "
            f"capturable=True), not a tensor left behind."
        )
    params = placement.get("parameters") or {}
    if params and spec.device.startswith("cuda"):
        on_cpu = [k for k, d in params.items() if d == "cpu"]
        if on_cpu:
            notes.append(f"Parameters left on the CPU: {', '.join(on_cpu)}.")
    return notes


def _dtype_support(details: dict[str, Any]) -> list[str]:
    support = details.get("dtype_support")
    if not support:
        return []
    matrix = support["matrix"]
    failed_move = [d for d, row in matrix.items() if not row["move"]["ok"]]
    partial = support["moves_but_some_ops_fail"]
    notes = [
        f"On {support['device']}: {len(matrix) - len(failed_move)} of {len(matrix)} dtypes "
        f"can be moved there; {len(partial)} of those still fail some op. Support is per op, "
        f"not only per transfer."
    ]
    for dtype, cols in list(partial.items())[:6]:
        first = matrix[dtype][cols[0]]
        notes.append(f"{dtype} moves but fails {', '.join(cols)}; e.g. {cols[0]}: {first['error']}")
    return notes


def _mismatch(spec: RunSpec, details: dict[str, Any], error: dict[str, Any] | None) -> list[str]:
    if error is not None and error["type"] == ErrorType.DEVICE_MISMATCH:
        devices = details.get("input_devices") or error["details"].get("input_devices") or {}
        where = ", ".join(f"{k} on {v}" for k, v in devices.items())
        return [f"PyTorch refused to mix devices ({where}); nothing ran silently on the CPU."]
    if details.get("allowed"):
        return [details["allowed"] + "."]
    return []


def _backend(result: dict[str, Any]) -> list[str]:
    conf = (result.get("environment") or {}).get("allocator_conf") or ""
    if "cudaMallocAsync" not in conf:
        return []
    return [
        "With backend cudaMallocAsync PyTorch records no allocation history: the trace is "
        "empty and the figures come from the allocator's counters (reserved is the driver "
        "pool's, which PyTorch does not split into blocks)."
    ]


def scenario(result: dict[str, Any], cuda: bool) -> list[str]:
    """Notes on a scenario's steps: where reserved grew, holes, and prediction gaps."""
    notes = []
    for step in result.get("steps") or []:
        if step.get("error"):
            notes.append(
                f"Step {step['name']} failed ({step['error']['type']}): "
                f"{step['error']['message'][:300]}"
            )
            continue
        a_end, pred = step.get("allocated_end"), step.get("predicted_allocated_after")
        r0, r1 = step.get("reserved_start"), step.get("reserved_end")
        if a_end is not None and pred is not None and a_end != pred:
            notes.append(
                f"Step {step['name']}: allocated {a_end:,} bytes against {pred:,} predicted "
                f"for the named tensors ({a_end - pred:+,}: library workspaces, cached "
                f"temporaries, or a view keeping its base)."
            )
        if cuda and r0 is not None and r1 is not None and r1 > r0 and step.get("do") == "create":
            holes = step.get("inactive_split_bytes") or 0
            notes.append(
                f"Step {step['name']}: reserved grew {r1 - r0:,} bytes"
                + (
                    f" while {holes:,} bytes sat free in split blocks (fragmentation: no hole "
                    f"was large enough)."
                    if holes
                    else "."
                )
            )
        if cuda and step.get("do") == "empty_cache" and r0 is not None and r1 is not None:
            notes.append(
                f"Step {step['name']}: empty_cache returned {r0 - r1:,} bytes of "
                f"cached segments to the driver."
            )
    retries = [s.get("alloc_retries") for s in result.get("steps") or [] if s.get("alloc_retries")]
    if retries:
        notes.append(
            f"The allocator retried {max(retries)} time(s) after freeing its cache: "
            f"a request found no cached block big enough."
        )
    return notes
