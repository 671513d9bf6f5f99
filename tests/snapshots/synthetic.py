"""A synthetic PyTorch memory snapshot shaped like a training loop, built without torch.

It has what ``torch.cuda.memory._snapshot()`` returns (``segments``, ``device_traces``,
``allocator_settings``), with frame dicts shared between stacks as PyTorch's symbolizer
shares them. Per iteration: forward activations and temporaries, a backward that makes
gradients and frees the activations, an optimizer step (its state made on the first
step), zero_grad. Parameters are made first by ``Module.to``. The bench scales it to 1 GiB.
"""

import pickle
from typing import Any

MiB = 2**20
BASE = 0x7F0000000000


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


MAIN = _frame("train.py", 40, "main")
TO = [
    _frame("torch/nn/modules/module.py", 900, "convert"),
    _frame("torch/nn/modules/module.py", 780, "_apply"),
    _frame("torch/nn/modules/module.py", 1170, "to"),
    MAIN,
]
FWD = [
    _frame("torch/nn/modules/linear.py", 125, "forward"),
    _frame("torch/nn/modules/module.py", 1750, "_call_impl"),
    _frame("train.py", 22, "forward"),
    MAIN,
]
BWD = [
    _frame("", 0, "torch::autograd::Engine::evaluate_function(...)"),
    _frame("", 0, "torch::autograd::Engine::thread_main(...)"),
    _frame("torch/autograd/__init__.py", 350, "backward"),
    _frame("torch/_tensor.py", 640, "backward"),
    MAIN,
]
OPT = [
    _frame("torch/optim/adam.py", 160, "_init_group"),
    _frame("torch/optim/adam.py", 230, "step"),
    MAIN,
]
OPT_TMP = [
    _frame("torch/optim/adam.py", 400, "_multi_tensor_adam"),
    _frame("torch/optim/adam.py", 230, "step"),
    MAIN,
]
ZERO = [_frame("torch/optim/optimizer.py", 990, "zero_grad"), MAIN]
DEPTH_PAD = [_frame(f"lib/site{i}.py", i, f"helper{i}") for i in range(64)]


class Trace:
    def __init__(self, stack_depth: int) -> None:
        self.entries: list[dict[str, Any]] = []
        self.t = 1_700_000_000_000_000
        self.next_addr = BASE
        self.pad = DEPTH_PAD[:stack_depth]

    def _stack(self, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A new list each time (one per entry, as PyTorch makes), of shared frame dicts.
        return [*base[:-1], *self.pad, base[-1]]

    def add(self, action: str, addr: int, size: int, stack: list[dict[str, Any]]) -> None:
        self.t += 3
        self.entries.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self.t,
                "frames": self._stack(stack),
            }
        )

    def alloc(self, size: int, stack: list[dict[str, Any]]) -> int:
        addr = self.next_addr
        self.next_addr += size
        self.add("alloc", addr, size, stack)
        return addr

    def free(self, addr: int, size: int, stack: list[dict[str, Any]]) -> None:
        self.add("free_requested", addr, size, stack)
        self.add("free_completed", addr, size, stack)


def _block(addr: int, size: int, state: str) -> dict[str, Any]:
    used = size if state == "active_allocated" else 0
    return {"address": addr, "size": size, "requested_size": used, "state": state, "frames": []}


def training_snapshot(
    iterations: int = 3,
    layers: int = 4,
    param_bytes: int = MiB,
    act_bytes: int = 2 * MiB,
    stack_depth: int = 0,
) -> dict[str, Any]:
    """A snapshot of ``iterations`` training steps of a ``layers``-layer model."""
    tr = Trace(stack_depth)
    seg_size = 2**30
    tr.add("segment_alloc", BASE, seg_size, TO)
    params = [tr.alloc(param_bytes, TO) for _ in range(layers)]
    state: list[int] = []
    for it in range(iterations):
        acts = []
        for _ in range(layers):
            acts.append(tr.alloc(act_bytes, FWD))
            tmp = tr.alloc(act_bytes // 4, FWD)
            tr.free(tmp, act_bytes // 4, FWD)
        grads = []
        for a in reversed(acts):
            grads.append(tr.alloc(param_bytes, BWD))
            tmp = tr.alloc(act_bytes // 2, BWD)
            tr.free(tmp, act_bytes // 2, BWD)
            tr.free(a, act_bytes, BWD)
        if it == 0:
            state = [tr.alloc(param_bytes, OPT) for _ in range(2 * layers)]
        tmp = tr.alloc(param_bytes, OPT_TMP)
        tr.free(tmp, param_bytes, OPT_TMP)
        for g in grads:
            tr.free(g, param_bytes, ZERO)
    blocks = []
    cursor = BASE
    for addr in sorted([*params, *state]):
        if addr > cursor:
            blocks.append(_block(cursor, addr - cursor, "inactive"))
        blocks.append(_block(addr, param_bytes, "active_allocated"))
        cursor = addr + param_bytes
    blocks.append(_block(cursor, BASE + seg_size - cursor, "inactive"))
    used = param_bytes * (len(params) + len(state))
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": seg_size,
        "allocated_size": used,
        "active_size": used,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [tr.entries], "allocator_settings": {}}


def dumps(snapshot: dict[str, Any]) -> bytes:
    return pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
