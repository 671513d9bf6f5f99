"""Snapshots shaped like PyTorch's ``torch.cuda.memory._snapshot()`` after
``_record_memory_history(stacks="python")`` (context "all": a free carries the stack of
its own call site), built without torch, entry for entry as a real one on an H100 reads
(tests/snapshots/data/train_python.pickle.gz, a two-layer loop with Adam).

What such a recording shows: the main thread's allocations with Python frames; autograd's
thread, which runs the backward, with none at all (not even for its own cuBLAS handle's
workspace: a second 32 MiB segment on Hopper); ``Tensor.backward`` is seen only where it
starts (``_make_grads``) and returns (the free of its seed gradient); the gradients are
freed inside ``Optimizer.zero_grad`` (set_to_none).
"""

from typing import Any

from tests.snapshots.synthetic import BASE, MiB, _frame

WORKSPACE = 32 * MiB  # cuBLAS's on Hopper, one per handle (thread)

MAIN = _frame("train.py", 40, "main")
LINEAR = [
    _frame("torch/nn/modules/linear.py", 134, "forward"),
    _frame("torch/nn/modules/module.py", 1790, "_call_impl"),
    _frame("torch/nn/modules/container.py", 253, "forward"),
    MAIN,
]
TO = [
    _frame("torch/nn/modules/module.py", 1370, "convert"),
    _frame("torch/nn/modules/module.py", 965, "_apply"),
    _frame("torch/nn/modules/module.py", 1400, "to"),
    MAIN,
]
BATCH = [_frame("train.py", 29, "main")]
LOSS = [_frame("torch/nn/functional.py", 3504, "cross_entropy"), _frame("train.py", 31, "main")]
MAKE_GRADS = [
    _frame("torch/autograd/__init__.py", 231, "_make_grads"),
    _frame("torch/autograd/__init__.py", 374, "backward"),
    _frame("torch/_tensor.py", 631, "backward"),
    _frame("train.py", 32, "main"),
]
BACKWARD_RETURN = [_frame("torch/_tensor.py", 631, "backward"), _frame("train.py", 32, "main")]
INIT_STATE = [
    _frame("torch/optim/adam.py", 178, "_init_group"),
    _frame("torch/optim/adam.py", 238, "step"),
    _frame("torch/optim/optimizer.py", 151, "_use_grad"),
    MAIN,
]
ADAM_TMP = [
    _frame("torch/optim/adam.py", 791, "_multi_tensor_adam"),
    _frame("torch/optim/adam.py", 971, "adam"),
    _frame("torch/optim/adam.py", 238, "step"),
    MAIN,
]
ADAM_FREE = [_frame("torch/optim/adam.py", 971, "adam"), _frame("torch/optim/adam.py", 238, "step")]
ZERO_GRAD = [
    _frame("torch/optim/optimizer.py", 1066, "zero_grad"),
    _frame("torch/_dynamo/eval_frame.py", 1263, "_fn"),
    MAIN,
]
PROGRAM = [_frame("train.py", 45, "main")]
RECOMPUTE = [
    _frame("torch/nn/modules/linear.py", 134, "forward"),
    _frame("torch/nn/modules/module.py", 1790, "_call_impl"),
    _frame("torch/utils/checkpoint.py", 1500, "recompute_fn"),
    _frame("torch/utils/checkpoint.py", 1130, "unpack_hook"),
]
NONE: list[dict[str, Any]] = []


class Recording:
    """Entries as the allocator records them: alloc, free_requested then free_completed,
    segment_alloc before a block that needed a new segment."""

    def __init__(self, context: str = "all") -> None:
        self.context = context
        self.stacks: dict[int, list[dict[str, Any]]] = {}
        self.entries: list[dict[str, Any]] = []
        self.t = 1_700_000_000_000_000
        self.small = BASE
        self.large = BASE + 2**34

    def _add(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        self.t += 5
        entry = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.t}
        if self.context == "alloc" and action.startswith("free"):
            stack = self.stacks[addr]  # the very list its allocation recorded
        else:
            stack = self.stacks[addr] = list(frames)
        self.entries.append({**entry, "frames": stack})

    def alloc(self, size: int, frames: list[dict[str, Any]], segment: bool = False) -> int:
        if segment:
            addr = self.large
            self.large += size
            self._add("segment_alloc", addr, size, frames)
        else:
            addr = self.small
            self.small += (size + 511) // 512 * 512
        self._add("alloc", addr, size, frames)
        return addr

    def free(self, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        self._add("free_requested", addr, size, frames)
        self._add("free_completed", addr, size, frames)


def adam_loop(
    steps: int = 2,
    layers: int = 2,
    param: int = MiB,
    act: int = MiB // 4,
    context: str = "all",
    set_to_none: bool = True,
    accumulate: int = 1,
    checkpoint: bool = False,
) -> Any:
    """``layers`` Linear layers, AdamW (foreach), ``loss.backward()`` over ``accumulate``
    micro-batches, ``opt.step()``, ``opt.zero_grad(set_to_none=...)``; the peak is inside
    the first step, where Adam makes its two moments while the gradients are alive.
    ``context="alloc"``: frees carry their allocation's stack (PyTorch's
    ``context="alloc"``). ``checkpoint``: each layer's forward is recomputed in backward,
    on autograd's thread, which records those Python frames. Returns the snapshot and the
    truth at that peak (bytes by category)."""
    r = Recording(context)
    for _ in range(layers):
        r.alloc(param, TO)
    first = True
    for step in range(steps):
        grads: list[int] = []
        for micro in range(accumulate):
            x = r.alloc(act, BATCH)
            outs = []
            for n in range(layers):
                if first and n == 0:
                    r.alloc(WORKSPACE, LINEAR, segment=True)  # the main thread's cuBLAS handle
                outs.append(r.alloc(act, LINEAR))
            loss = r.alloc(512, LOSS)
            seed = r.alloc(4, MAKE_GRADS)
            for n in range(layers):
                again = r.alloc(act, RECOMPUTE) if checkpoint else 0
                tmp = r.alloc(act, NONE)  # with accumulation: the new gradient, added in place
                if first and n == 0:
                    r.alloc(WORKSPACE, NONE, segment=True)  # autograd's thread's own handle
                if micro == 0 and (set_to_none or step == 0):
                    grads.append(r.alloc(param, NONE))
                r.free(tmp, act, NONE)
                r.free(outs[-1 - n], act, NONE)  # the saved activation, released by backward
                if checkpoint:
                    r.free(again, act, NONE)
            r.free(seed, 4, BACKWARD_RETURN)
            first = False
            if micro < accumulate - 1:
                r.free(loss, 512, PROGRAM)
                r.free(x, act, PROGRAM)
        if step == 0:
            for _ in range(2 * layers):
                r.alloc(param, INIT_STATE)
        tmps = [r.alloc(param, ADAM_TMP) for _ in range(layers)]
        for t in tmps:
            r.free(t, param, ADAM_FREE)
        for g in grads if set_to_none else ():
            r.free(g, param, ZERO_GRAD)
        r.free(loss, 512, PROGRAM)
        r.free(x, act, PROGRAM)
    truth = {
        "parameters": layers * param,
        "gradients": layers * param,
        "optimizer_state": 2 * layers * param,
        "activations": 0,
        "temporaries": 2 * WORKSPACE + layers * param,
        "other": act + 512,  # the batch and the loss, made by the program itself
        "unknown": 0,
    }
    snapshot = {"segments": [], "device_traces": [r.entries], "allocator_settings": {}}
    return snapshot, truth


def oom_in_backward(layers: int = 2, param: int = MiB, act: int = MiB // 4) -> Any:
    """A loop that stops inside its first backward (an out-of-memory error there), with a
    block of no frames made outside any backward (another thread's). The gradients made
    so far may be gradients or temporaries: the trace ends before backward returned."""
    r = Recording()
    for _ in range(layers):
        r.alloc(param, TO)
    x = r.alloc(act, BATCH)
    r.alloc(act, NONE)  # no frames, outside backward: nothing says what it is
    outs = [r.alloc(act, LINEAR) for _ in range(layers)]
    r.alloc(WORKSPACE, LINEAR, segment=True)
    r.alloc(512, LOSS)
    r.alloc(4, MAKE_GRADS)
    r.alloc(WORKSPACE, NONE, segment=True)
    for n in range(layers):
        tmp = r.alloc(act, NONE)
        r.alloc(param, NONE)
        if n < layers - 1:
            r.free(tmp, act, NONE)
            r.free(outs[-1 - n], act, NONE)
    r._add("oom", 0, param, NONE)
    del x
    truth = {
        "parameters": layers * param,
        "gradients": 0,
        "optimizer_state": 0,
        "activations": 0,
        "temporaries": 2 * WORKSPACE,
        "other": act + 512,
        # The gradients, the last temporary and the seed (one 512-byte block), the block of
        # no frames outside backward, and the first layer's output (saved for the backward
        # under way, or held by the program: the trace ends before it could tell).
        "unknown": layers * param + act + 512 + act + act,
    }
    snapshot = {"segments": [], "device_traces": [r.entries], "allocator_settings": {}}
    return snapshot, truth
