"""``vramlab record``'s hooks inside the program (``tensor_marks``), on CPU tensors: what
they note of parameters, gradients and optimizer state, and that they never change or
break the program."""

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from vramlab.recorder_boot.tensor_marks import Marks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _train(marks: Marks, set_to_none: bool, steps: int = 2) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    opt = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    marks.see_all()
    return model, opt


@pytest.fixture
def marks() -> Any:
    m = Marks(torch, device_type="cpu")
    m.install()
    yield m
    m.uninstall()


def test_each_tensor_is_noted_once_with_the_times_it_was_seen(marks: Marks) -> None:
    model, _ = _train(marks, set_to_none=False)
    kinds = Counter(e[2] for e in marks.entries)
    # Four parameters (the Linear's, the BatchNorm's) and three buffers; the same four
    # .grad tensors, zeroed in place, seen again and again; Adam's two moments and step per
    # parameter (the step is a CPU tensor, like everything here).
    assert kinds == {"parameters": 7, "gradients": 4, "optimizer_state": 12}
    by_addr = {(e[0], e[2]): e for e in marks.entries}
    for p in model.parameters():
        entry = by_addr[(p.grad.untyped_storage().data_ptr(), "gradients")]
        assert entry[1] == p.grad.untyped_storage().nbytes()
        assert entry[3] < entry[4]  # first seen at its accumulation, last at the end
    assert marks.errors == 0


def test_a_new_gradient_each_step_is_a_new_sighting(marks: Marks) -> None:
    _train(marks, set_to_none=True, steps=3)
    assert Counter(e[2] for e in marks.entries)["gradients"] == 4 * 3


def test_the_hooks_come_out_again() -> None:
    original = torch.optim.Optimizer.add_param_group
    m = Marks(torch, device_type="cpu")
    m.install()
    assert torch.optim.Optimizer.add_param_group is not original
    m.uninstall()
    assert torch.optim.Optimizer.add_param_group is original
    _train(m, set_to_none=True)
    assert [e[2] for e in m.entries] == []  # nothing was hooked after


def test_a_failing_hook_never_fails_the_program(marks: Marks, monkeypatch: Any) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(marks, "see", broken)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()  # the step's hooks and the grad's hook all failed inside
    assert marks.errors >= 3
    assert model.weight.grad is not None


def test_the_program_sees_the_same_numbers(marks: Marks) -> None:
    model, _ = _train(marks, set_to_none=True)
    marks.uninstall()
    alone = Marks(torch, device_type="cuda")  # hooks nothing
    again, _ = _train(alone, set_to_none=True)
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_bootstrap_dumps_at_a_sigterm_then_dies_of_it(tmp_path: Path) -> None:
    """A SIGTERM (a scheduler's limit) skips atexit: the bootstrap dumps first, then the
    program dies of the signal as it would have."""
    program = tmp_path / "term.py"
    dumped = tmp_path / "dumped"
    program.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(ROOT / "client")!r})
            from vramlab.recorder_boot.sitecustomize import _dump_on_sigterm
            _dump_on_sigterm(lambda: open({str(dumped)!r}, "w").write("yes"))
            print("before", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_RECORD")}
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, env=env)
    assert done.returncode == -signal.SIGTERM and done.stdout == "before\n"
    assert dumped.read_text() == "yes"


def test_a_program_with_its_own_sigterm_handler_keeps_it(tmp_path: Path) -> None:
    program = tmp_path / "own.py"
    program.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(ROOT / "client")!r})
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
            from vramlab.recorder_boot.sitecustomize import _dump_on_sigterm
            _dump_on_sigterm(lambda: print("dumped"))
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
            """
        )
    )
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    assert done.returncode == 7 and "dumped" not in done.stdout


def test_past_its_limit_the_oldest_sightings_go_and_live_tensors_come_back() -> None:
    m = Marks(torch, device_type="cpu", limit=30)
    m.install()
    try:
        model, _ = _train(m, set_to_none=True, steps=6)
    finally:
        m.uninstall()
    assert m.truncated and len(m.entries) <= 30
    # The parameters, alive all along, are noted again after the oldest went.
    kept = {e[0] for e in m.entries if e[2] == "parameters"}
    assert {p.untyped_storage().data_ptr() for p in model.parameters()} <= kept


FAKE_CUDA = textwrap.dedent(
    """
    import os, sys, types
    import torch
    # No GPU here: the few CUDA calls the bootstrap makes, answered as by a GPU whose
    # trace is empty. What is checked is the bootstrap's own glue.
    torch.cuda.is_available = lambda: True
    torch.cuda.memory._record_memory_history = lambda *a, **k: None
    torch.cuda.memory._snapshot = lambda: {{"segments": [], "device_traces": [[]]}}
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_stats = lambda i=0: {{"allocated_bytes.all.peak": 0}}
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(name="x", total_memory=1)
    torch._C._cuda_attach_out_of_memory_observer = lambda f: None
    torch.cuda.current_device = lambda: 0
    torch._C._cuda_memoryStats = lambda d: {{"allocation": {{"all": {{"allocated": 7}}}}}}
    sys.path.insert(0, {boot!r})
    import sitecustomize  # what Python imports at start-up under vramlab record
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    """
)


def test_the_bootstrap_dumps_its_marks_as_plain_data(tmp_path: Path) -> None:
    from app.snapshots import safe_pickle

    program = tmp_path / "boot.py"
    program.write_text(FAKE_CUDA.format(boot=str(ROOT / "client" / "vramlab" / "recorder_boot")))
    out = tmp_path / "snap.pickle"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_RECORD")}
    env["VRAMLAB_RECORD_OUT"] = str(out)
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "will be inferred" not in done.stderr
    with out.open("rb") as f:
        snap = safe_pickle.load(f)  # builtins only, as the import reads it
    marks = snap["vramlab_categories"]
    assert marks["clock"] == "unix_us" and marks["errors"] == 0
    assert marks["tensors"] == []  # CPU tensors: not the device it records
    phases = snap["vramlab_phases"]
    assert [m[0] for m in phases["marks"]] == [
        "forward_start",
        "forward_end",
        "backward_start",
        "backward_end",
        "step_start",
        "step_end",
    ]
    assert {m[1] for m in phases["marks"]} == {7} and phases["allocations_at_dump"] == 7
    assert phases["device"] == 0 and phases["errors"] == 0


def test_phase_hooks_never_fail_the_program_and_come_out_again() -> None:
    """A counter that fails is counted as the hooks' error, never the program's; the
    program computes the same numbers; uninstalling puts torch's functions back."""
    from vramlab.recorder_boot.phase_marks import Phases

    original = torch.autograd.backward, torch.autograd.grad

    def broken() -> int:
        raise RuntimeError("no counter")

    phases = Phases(torch, broken)
    phases.install()
    try:
        assert torch.autograd.backward is not original[0]
        model, _ = _train(Marks(torch, device_type="cuda"), set_to_none=True)
        x = torch.ones(8, requires_grad=True)
        (g,) = torch.autograd.grad((x * 2).sum(), x)
        assert torch.equal(g, torch.full((8,), 2.0))
    finally:
        phases.uninstall()
    assert phases.errors > 0 and phases.marks == []
    assert (torch.autograd.backward, torch.autograd.grad) == original
    again, _ = _train(Marks(torch, device_type="cuda"), set_to_none=True)
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_tensor_without_a_storage_is_skipped_not_the_rest(marks: Marks) -> None:
    class NoStorage(torch.Tensor):
        def untyped_storage(self) -> Any:
            raise RuntimeError("no storage of its own")

    model = torch.nn.Linear(4, 4)
    model.odd = torch.nn.Parameter(torch.zeros(3).as_subclass(NoStorage))
    marks.see_all()
    seen = {e[0] for e in marks.entries}
    assert model.weight.untyped_storage().data_ptr() in seen
    assert marks.errors == 1
