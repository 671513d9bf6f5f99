"""Which blocks of a recorded program are parameters, gradients and optimizer state, seen
from inside the program by tensor identity, so that ``vramlab record``'s categories of
those need no inference.

Hooks note where each such tensor's storage lives while it is alive (its address, size
and the times it was seen, on the clock of PyTorch's trace entries: microseconds since
the epoch): every parameter and buffer of every module (a global registration hook keeps
the modules), each parameter's ``.grad`` as soon as it is accumulated (a hook per
optimized parameter), and everything again around every optimizer step and at the dump
(the optimizers' ``state``). The import matches each sighting to the block alive at that
address at that time. The hooks only read tensors' addresses: they allocate nothing, and
do nothing while ``torch.compile`` traces.

Torch is imported by the caller and handed in; this module imports nothing of it, so the
client stays torch-free (the tests drive it with CPU tensors).
"""

import time
import weakref
from typing import Any

KEY = "vramlab_categories"
PARAMETERS, GRADIENTS, OPTIMIZER_STATE = "parameters", "gradients", "optimizer_state"


def now_us() -> int:
    """The clock of PyTorch's trace entries (``time_us``: CLOCK_REALTIME)."""
    return time.time_ns() // 1000


class _Objects:
    """Objects held weakly by identity (a WeakSet compares tensors with ``==``)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def add(self, obj: Any) -> bool:
        """Whether ``obj`` was new."""
        key = id(obj)
        held = self._refs.get(key)
        if held is not None and held() is obj:
            return False

        def gone(ref: weakref.ref[Any], key: int = key) -> None:
            if self._refs.get(key) is ref:
                del self._refs[key]

        self._refs[key] = weakref.ref(obj, gone)
        return True

    def __iter__(self) -> Any:
        for ref in list(self._refs.values()):
            obj = ref()
            if obj is not None:
                yield obj


class Marks:
    """The sightings of one program: ``[address, bytes, category, first_us, last_us]``,
    one per tensor identity (a tensor seen again at the same address extends its own), at
    most ``limit`` of them (the newest: a long run's oldest go, as from PyTorch's ring
    buffer)."""

    def __init__(self, torch: Any, device_type: str = "cuda", limit: int = 1_000_000) -> None:
        self.torch = torch
        self.device_type = device_type
        self.limit = limit
        self.modules = _Objects()
        self.optimizers = _Objects()
        self.hooked = _Objects()  # parameters with our post-accumulate-grad hook
        self.entries: list[list[Any]] = []
        self.truncated = False
        self.errors = 0
        self._current: dict[tuple[int, str], tuple[weakref.ref[Any], list[Any]]] = {}
        self.handles: list[Any] = []
        self._restore: tuple[Any, Any] | None = None

    # -- what is seen ---------------------------------------------------------------------

    def see(self, tensor: Any, category: str, at: int) -> None:
        if not isinstance(tensor, self.torch.Tensor):
            return
        try:
            if tensor.device.type != self.device_type:
                return
            storage = tensor.untyped_storage()
            addr, size = int(storage.data_ptr()), int(storage.nbytes())
        except Exception:  # a tensor subclass without one storage (DTensor...): skipped
            self.errors += 1
            return
        if addr == 0 or size == 0:
            return
        key = (addr, category)
        held = self._current.get(key)
        if held is not None and held[0]() is tensor:
            held[1][4] = at
            return
        if len(self.entries) >= self.limit:
            # Like PyTorch's ring buffer: the oldest half goes. Tensors still alive are
            # noted afresh when next seen (every step sees them all).
            del self.entries[: len(self.entries) // 2]
            self._current.clear()
            self.truncated = True
        entry = [addr, size, category, at, at]
        self.entries.append(entry)
        self._current[key] = (weakref.ref(tensor), entry)

    def see_all(self) -> None:
        """Every parameter, buffer, gradient and optimizer state tensor alive now."""
        if self._compiling():
            return
        at = now_us()
        params = []
        for module in self.modules:
            for p in list(module._parameters.values()):
                if p is not None:
                    params.append(p)
                    self.see(p, PARAMETERS, at)
            for b in list(module._buffers.values()):
                if b is not None:
                    self.see(b, PARAMETERS, at)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    params.append(p)
                    self.see(p, PARAMETERS, at)
            for state in list(optimizer.state.values()):
                if isinstance(state, dict):
                    for value in list(state.values()):
                        self.see(value, OPTIMIZER_STATE, at)
        for p in params:
            self.see(p.grad, GRADIENTS, at)

    def data(self) -> dict[str, Any]:
        """What the dump stores under ``KEY``: builtins only."""
        return {
            "version": 1,
            "clock": "unix_us",
            "device_type": self.device_type,
            "tensors": [list(e) for e in self.entries],
            "truncated": self.truncated,
            "errors": self.errors,
        }

    # -- the hooks ------------------------------------------------------------------------

    def _compiling(self) -> bool:
        compiler = getattr(self.torch, "compiler", None)
        is_compiling = getattr(compiler, "is_compiling", None)
        return bool(is_compiling()) if is_compiling is not None else False

    def _safely(self, fn: Any, *args: Any) -> None:
        """Never turn a hook of ours into the program's failure."""
        try:
            fn(*args)
        except Exception:
            self.errors += 1

    def _grad_accumulated(self, param: Any) -> None:
        if self._compiling():
            return
        at = now_us()
        self.see(param, PARAMETERS, at)
        self.see(param.grad, GRADIENTS, at)

    def _hook_params(self, params: Any) -> None:
        for p in params:
            if isinstance(p, self.torch.Tensor) and p.requires_grad and self.hooked.add(p):
                register = getattr(p, "register_post_accumulate_grad_hook", None)
                if register is not None:
                    self.handles.append(
                        register(lambda param: self._safely(self._grad_accumulated, param))
                    )

    def _group_added(self, optimizer: Any) -> None:
        self.optimizers.add(optimizer)
        if optimizer.param_groups:
            self._hook_params(optimizer.param_groups[-1]["params"])

    def install(self) -> None:
        """Hook modules and optimizers made from now on (the global hooks), and the step."""
        import importlib

        torch = self.torch
        nn_module = importlib.import_module("torch.nn.modules.module")

        def registered(module: Any, name: str, tensor: Any) -> None:
            self.modules.add(module)

        for hook in ("parameter", "buffer"):
            register = getattr(nn_module, f"register_module_{hook}_registration_hook", None)
            if register is not None:
                self.handles.append(register(registered))
        optimizer_cls = torch.optim.Optimizer
        original = optimizer_cls.add_param_group
        marks = self

        def add_param_group(self: Any, param_group: Any) -> Any:
            result = original(self, param_group)
            marks._safely(marks._group_added, self)
            return result

        add_param_group.__wrapped__ = original  # type: ignore[attr-defined]
        optimizer_cls.add_param_group = add_param_group
        self._restore = (optimizer_cls, original)
        optim = importlib.import_module("torch.optim.optimizer")
        for name in ("register_optimizer_step_pre_hook", "register_optimizer_step_post_hook"):
            register = getattr(optim, name, None)
            if register is not None:
                self.handles.append(
                    register(lambda optimizer, args, kwargs: self._safely(self.see_all))
                )

    def uninstall(self) -> None:
        """Take the hooks out again (the tests'; a recording keeps them to the end)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if self._restore is not None:
            cls, original = self._restore
            cls.add_param_group = original
            self._restore = None
