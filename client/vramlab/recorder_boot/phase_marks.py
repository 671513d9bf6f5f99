"""Where a recorded program's forwards, backwards and optimizer steps began and ended, on
the allocator's own count of allocations, so that the import can tell for each block
whether it was made in a forward (an activation), a backward or a step (a temporary),
or outside all three (the program's own: inputs, targets) without inference.

A mark is ``[kind, allocations, time_us]``: ``allocations`` is how many allocations the
device's caching allocator had made when the mark was taken (its counter
``allocation.all.allocated``), so allocation number ``allocations + 1`` is the first after
it — exact, where a time on the trace's microsecond clock could tie. At the dump the
counter is read once more (``allocations_at_dump``), which ties the trace's last
allocation to a number, and so every allocation of the trace, whatever the ring buffer
dropped. The marks:

- ``forward_start``/``forward_end``: the outermost module call (global module hooks);
  inside a backward that is a forward recomputed for it (activation checkpointing);
- ``backward_start``/``backward_end``: the outermost ``torch.autograd.backward`` or
  ``torch.autograd.grad`` call (``Tensor.backward`` calls the former);
- ``step_start``/``step_end``: every optimizer step (global optimizer hooks).

Torch is handed in, as to ``tensor_marks``; nothing here allocates on the device, raises
into the program or runs while ``torch.compile`` traces.
"""

import time
from collections.abc import Callable
from typing import Any

KEY = "vramlab_phases"
KINDS = (
    "forward_start",
    "forward_end",
    "backward_start",
    "backward_end",
    "step_start",
    "step_end",
)


def allocations_counter(torch: Any, device: int) -> Callable[[], int]:
    """How many allocations ``device``'s caching allocator has made, read cheaply."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return lambda: int(raw(device)["allocation"]["all"]["allocated"])
    return lambda: int(torch.cuda.memory_stats(device)["allocation.all.allocated"])


class Phases:
    """The marks of one program, at most ``limit`` of them (past it the oldest half goes
    and ``truncated`` says so)."""

    def __init__(
        self, torch: Any, count: Callable[[], int], device: int = 0, limit: int = 1_000_000
    ) -> None:
        self.torch = torch
        self.count = count
        self.device = device
        self.limit = limit
        self.marks: list[list[Any]] = []
        self.truncated = False
        self.errors = 0
        self.depth = 0  # module calls open now
        self.in_backward = False
        self.handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []

    def mark(self, kind: str) -> None:
        if len(self.marks) >= self.limit:
            del self.marks[: len(self.marks) // 2]
            self.truncated = True
        self.marks.append([kind, self.count(), time.time_ns() // 1000])

    def data(self, at_dump: bool = True) -> dict[str, Any]:
        """What the dump stores under ``KEY``: builtins only; the counter read now."""
        out: dict[str, Any] = {
            "version": 1,
            "device": self.device,
            "counter": "allocation.all.allocated",
            "marks": [list(m) for m in self.marks],
            "truncated": self.truncated,
            "errors": self.errors,
        }
        if at_dump:
            out["allocations_at_dump"] = self.count()
        return out

    # -- the hooks ------------------------------------------------------------------------

    def _compiling(self) -> bool:
        compiler = getattr(self.torch, "compiler", None)
        is_compiling = getattr(compiler, "is_compiling", None)
        return bool(is_compiling()) if is_compiling is not None else False

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            if not self._compiling():
                fn()
        except Exception:
            self.errors += 1

    def _forward_pre(self, module: Any, args: Any) -> None:
        def enter() -> None:
            self.depth += 1
            if self.depth == 1:
                self.mark("forward_start")

        self._safely(enter)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        def leave() -> None:
            if self.depth == 1:
                self.mark("forward_end")
            self.depth = max(0, self.depth - 1)

        self._safely(leave)

    def _outermost(self, start: str, end: str, original: Any) -> Any:
        """``original`` wrapped: its outermost call marked ``start`` and ``end``."""
        phases = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            outer = not phases.in_backward
            if outer:
                phases.in_backward = True

                def begin() -> None:
                    phases.depth = 0  # a forward that raised never closed its calls
                    phases.mark(start)

                phases._safely(begin)
            try:
                return original(*args, **kwargs)
            finally:
                if outer:
                    phases.in_backward = False
                    phases._safely(lambda: phases.mark(end))

        wrapped.__wrapped__ = original  # type: ignore[attr-defined]
        wrapped.__doc__ = original.__doc__
        wrapped.__name__ = getattr(original, "__name__", "wrapped")
        return wrapped

    def _step(self, kind: str) -> Callable[[Any, Any, Any], None]:
        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            def note() -> None:
                self.depth = 0
                self.mark(kind)

            self._safely(note)

        return hook

    def install(self) -> None:
        import importlib

        torch = self.torch
        nn_module = importlib.import_module("torch.nn.modules.module")
        self.handles.append(nn_module.register_module_forward_pre_hook(self._forward_pre))
        try:
            handle = nn_module.register_module_forward_hook(self._forward_post, always_call=True)
        except TypeError:  # an older torch: a forward that raises leaves its call open
            handle = nn_module.register_module_forward_hook(self._forward_post)
        self.handles.append(handle)
        autograd = torch.autograd
        for name in ("backward", "grad"):
            original = getattr(autograd, name)
            setattr(autograd, name, self._outermost("backward_start", "backward_end", original))
            self._restore.append((autograd, name, original))
        optim = importlib.import_module("torch.optim.optimizer")
        self.handles.append(optim.register_optimizer_step_pre_hook(self._step("step_start")))
        self.handles.append(optim.register_optimizer_step_post_hook(self._step("step_end")))

    def uninstall(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
