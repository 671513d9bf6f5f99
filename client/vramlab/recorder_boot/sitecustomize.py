"""Turns on PyTorch's allocation history in a program that ``vramlab record`` runs, and
dumps the snapshot at exit and at the first CUDA out-of-memory error.

Python imports ``sitecustomize`` at start-up from the PYTHONPATH; ``vramlab record`` puts
this folder first and says where to write in ``VRAMLAB_RECORD_OUT``. Only the first
Python process of the program records (its children inherit a marker and skip), and a
program without CUDA is left alone with a warning. The dump is PyTorch's own snapshot,
plus ``memory_stats`` (PyTorch's counters, per device), ``environment``,
``vramlab_categories``: where the program's parameters, gradients and optimizer state
lived, seen from inside it (``tensor_marks``), and ``vramlab_phases``: where its forwards,
backwards and optimizer steps began and ended (``phase_marks``), so categories need no
inference.
"""

import os
import sys
from typing import Any

KEY = "vramlab_categories"  # tensor_marks.KEY
PHASES = "vramlab_phases"  # phase_marks.KEY


def plain(value: Any) -> Any:
    """Only the builtin types a snapshot may hold: vramlab's loader refuses any class,
    and torch hands out subclasses (``torch.__version__`` is a ``TorchVersion``,
    ``memory_stats()`` an ``OrderedDict``)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return str(value)


CHECKPOINTING_NOTE = (
    "vramlab record: this program uses non-reentrant activation checkpointing, whose "
    "backward breaks while PyTorch records stacks where blocks are freed; recording stacks "
    "where blocks are made only, from here on (free sites are not recorded)\n"
)


def _guard_checkpointing(torch: Any, stacks: str, max_entries: int) -> None:
    """Never break the program: PyTorch's allocation history with stacks at frees
    (``context="all"``) makes the backward of non-reentrant checkpointing fail (torch 2.11:
    SystemError in run_backward). The first such checkpoint switches the recording to
    stacks at allocations only, keeping what was recorded, and says so."""
    import torch.utils.checkpoint as checkpointing

    original = checkpointing.checkpoint
    switched: list[bool] = []

    def checkpoint(function: Any, *args: Any, use_reentrant: Any = None, **kwargs: Any) -> Any:
        if use_reentrant is False and not switched:
            switched.append(True)
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks=stacks, max_entries=max_entries
            )
            os.environ["VRAMLAB_RECORD_CONTEXT"] = "alloc"
            sys.stderr.write(CHECKPOINTING_NOTE)
        return original(function, *args, use_reentrant=use_reentrant, **kwargs)

    checkpointing.checkpoint = checkpoint


def _beside(name: str) -> Any:
    """A module of this folder, loaded from its file (the program's environment need not
    have vramlab installed)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"vramlab_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hooked(what: str, make: Any) -> Any:
    """``make()``'s hooks installed; None if that fails (the recording goes on, and what
    they would have recorded, ``what``, is inferred)."""
    try:
        hooks = make()
        hooks.install()
        return hooks
    except Exception as exc:
        sys.stderr.write(f"vramlab record: {what} will be inferred ({exc})\n")
        return None


def _marks(torch: Any) -> Any:
    """``tensor_marks.Marks``: parameters, gradients and optimizer state by identity."""

    def make() -> Any:
        entries = int(os.environ.get("VRAMLAB_RECORD_MAX_ENTRIES", "0"))
        limit = max(10_000, 2 * entries) if entries else 1_000_000
        return _beside("tensor_marks").Marks(torch, limit=limit)

    return _hooked("categories", make)


def _phases(torch: Any) -> Any:
    """``phase_marks.Phases`` on the current device."""

    def make() -> Any:
        module = _beside("phase_marks")
        device = int(torch.cuda.current_device())
        return module.Phases(torch, module.allocations_counter(torch, device), device)

    return _hooked("phases", make)


def _start(out: str) -> None:
    try:
        import torch
    except ImportError:
        sys.stderr.write("vramlab record: torch is not importable here; nothing recorded\n")
        return
    if not torch.cuda.is_available():
        sys.stderr.write("vramlab record: no CUDA device; nothing recorded\n")
        return
    import atexit
    import pickle
    import platform

    stacks = os.environ.get("VRAMLAB_RECORD_STACKS", "all")
    max_entries = int(os.environ.get("VRAMLAB_RECORD_MAX_ENTRIES", str(sys.maxsize)))
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks=stacks, max_entries=max_entries
    )
    _guard_checkpointing(torch, stacks, max_entries)
    marks = _marks(torch)
    phases = _phases(torch)

    def dump(path: str) -> None:
        categories = None
        if marks is not None:
            marks._safely(marks.see_all)
            categories = plain(marks.data())
        # The counter is read right before the snapshot: nothing allocates between.
        phase_data = plain(phases.data()) if phases is not None else None
        snapshot = torch.cuda.memory._snapshot()
        if categories is not None:
            snapshot[KEY] = categories
        if phase_data is not None:
            snapshot[PHASES] = phase_data
        count = torch.cuda.device_count()
        snapshot["memory_stats"] = plain([torch.cuda.memory_stats(i) for i in range(count)])
        props = torch.cuda.get_device_properties(0)
        snapshot["environment"] = plain(
            {
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "gpu_name": props.name,
                "gpu_total_memory": int(props.total_memory),
                "gpus": count,
                "python": platform.python_version(),
                "argv": [str(a)[:200] for a in sys.argv[:20]],
                "stacks": stacks,
                "free_stacks": os.environ.get("VRAMLAB_RECORD_CONTEXT") != "alloc",
                "max_entries": max_entries if max_entries < sys.maxsize else None,
            }
        )
        tmp = path + ".part"
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        os.replace(tmp, path)

    dumped_oom: list[bool] = []

    def on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        # The first OOM: kept even if the program is then killed before it exits.
        if not dumped_oom:
            dumped_oom.append(True)
            try:
                dump(out + ".oom")
            except Exception as exc:  # never turn an OOM into a different failure
                sys.stderr.write(f"vramlab record: could not dump at the OOM: {exc}\n")

    torch._C._cuda_attach_out_of_memory_observer(on_oom)  # type: ignore[attr-defined]

    def at_exit() -> None:
        try:
            dump(out)
        except Exception as exc:
            sys.stderr.write(f"vramlab record: could not dump the snapshot: {exc}\n")

    atexit.register(at_exit)
    _dump_on_sigterm(at_exit)


def _dump_on_sigterm(at_exit: Any) -> None:
    """A SIGTERM (a scheduler's time limit, ``kill``) ends a program without its atexit:
    where the program left SIGTERM to its default, dump first, then die of it as before
    (the program's own handler, set later, replaces this one)."""
    import signal

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        at_exit()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


_OUT = os.environ.get("VRAMLAB_RECORD_OUT")
if _OUT and not os.environ.get("VRAMLAB_RECORD_OWNER"):
    os.environ["VRAMLAB_RECORD_OWNER"] = str(os.getpid())
    _start(_OUT)
