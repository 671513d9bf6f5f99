"""Where each tensor lives, and host-device copies that happened inside the op.

``CopyWatcher`` is a TorchDispatchMode: it sees every aten call with its tensors, so it
finds copies between devices (``_to_copy``, ``copy_``), calls whose inputs sit on more
than one device, and, in a CUDA experiment, work done on the CPU. It runs on one extra
call after the measured phases, so its Python overhead is in no figure.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_COPIES = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}
# Calls that compute nothing (queries, views, allocation, pinning): a CPU tensor going
# through them in a CUDA experiment is no sign of work left on the CPU.
_NO_WORK = {
    "is_pinned", "pin_memory", "_pin_memory", "detach", "alias", "lift_fresh",
    "view", "_unsafe_view", "_reshape_alias", "as_strided", "t", "transpose", "permute",
    "expand", "slice", "select", "unsqueeze", "squeeze", "empty", "empty_strided",
    "empty_like",
}  # fmt: skip
MAX_LISTED = 20


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class CopyWatcher(TorchDispatchMode):
    def __init__(self, experiment_device: torch.device) -> None:
        super().__init__()
        self.cuda = experiment_device.type == "cuda"
        self.copies: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.mixed: dict[str, list[str]] = {}
        self.cpu_ops: dict[str, int] = {}
        # CPU calls on 0-dim tensors alone: scalar state PyTorch keeps on the host by
        # design (Adam's and AdamW's step counters unless capturable=True), not user
        # tensors left behind.
        self.host_scalar_ops: dict[str, int] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        if name in _COPIES and ins:
            src = ins[1] if name == "copy_" and len(ins) > 1 else ins[0]
            dst = ins[0] if name == "copy_" else (outs[0] if outs else None)
            if dst is not None and src.device != dst.device:
                key = (name, str(src.device), str(dst.device))
                entry = self.copies.setdefault(
                    key,
                    {"op": f"aten::{name}", "from": key[1], "to": key[2], "calls": 0, "bytes": 0},
                )
                entry["calls"] += 1
                entry["bytes"] += src.nbytes
            return out
        # A 0-dim CPU tensor is allowed beside others: PyTorch reads it as a scalar.
        devices = {str(t.device) for t in ins if not (t.dim() == 0 and t.device.type == "cpu")}
        if len(devices) > 1:
            self.mixed[f"aten::{name}"] = sorted(devices)
        on_cpu = all(t.device.type == "cpu" for t in (*ins, *outs))
        if self.cuda and ins and on_cpu and name not in _NO_WORK:
            scalars = all(t.dim() == 0 for t in (*ins, *outs))
            counts = self.host_scalar_ops if scalars else self.cpu_ops
            counts[f"aten::{name}"] = counts.get(f"aten::{name}", 0) + 1
        return out

    def report(self) -> dict[str, Any]:
        copies = list(self.copies.values())
        flagged = [c for c in copies if "cpu" in (c["from"], c["to"])]
        return {
            "host_device_copies": flagged,
            "device_device_copies": [c for c in copies if c not in flagged],
            "mixed_device_calls": self.mixed,
            "cpu_ops_in_cuda_experiment": dict(list(self.cpu_ops.items())[:MAX_LISTED]),
            "host_scalar_ops": dict(list(self.host_scalar_ops.items())[:MAX_LISTED]),
            "method": "a TorchDispatchMode over one extra call of the op after the measured "
            "phases (for a scenario: over the whole run)",
        }


def placement(
    inputs: dict[str, torch.Tensor],
    outputs: list[tuple[str, torch.Tensor]],
    extras: dict[str, Any],
    watched: dict[str, Any] | None,
) -> dict[str, Any]:
    """Where every input, output and parameter lives, and the copies the watcher saw."""
    params = {k: str(v.device) for k, v in inputs.items() if k.startswith("param:")}
    out: dict[str, Any] = {
        "inputs": {k: str(v.device) for k, v in inputs.items() if not k.startswith("param:")},
        "outputs": {k: str(v.device) for k, v in outputs},
        "parameters": params,
    }
    if extras.get("parameter_devices"):
        out["parameter_devices"] = extras["parameter_devices"]
    if watched is not None:
        out.update(watched)
    return out
