"""The training loops of ``bench/category_truth.py`` and the truth computed inside them.

Each fixture is a small training loop (``FIXTURES``). The truth at the peak: of the
storages alive when PyTorch's ``MemTracker`` sees its peak, those that were (or became) a
parameter, a gradient or optimizer state by tensor identity (``truth``), and MemTracker's
own attribution of the rest (activations, inputs as other, temporaries). Library
workspaces (cuBLAS's per handle) are no tensor, so no tracker sees them: they are measured
at the end of the recorded run as the allocator's bytes that no live tensor holds, and
counted with the temporaries, as is an op's own scratch (buffers it makes and frees within
itself, measured around each op with the allocator's peak counter): the truth is taken at
the allocator's peak, where such scratch may be alive, not at MemTracker's. Blocks are
counted as the caching allocator does (rounded up to 512 bytes).

Run by ``category_truth.py`` as ``python bench/category_loops.py FIXTURE`` (the program
``vramlab record`` records: its OOM fixture dies of the OOM, as a program would).
"""

import gc
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

P, G, S = "parameters", "gradients", "optimizer_state"
A, T, OTHER = "activations", "temporaries", "other"
CATEGORIES = (P, G, S, A, T, OTHER, "unknown")


@dataclass(frozen=True)
class Fixture:
    model: str = "mlp"  # mlp or transformer
    optimizer: str = "adamw"  # adamw, adam_foreach, adam_fused, sgd_momentum
    set_to_none: bool = True
    micro: int = 1  # micro-batches per step (gradient accumulation)
    amp: bool = False  # autocast fp16 and a GradScaler
    checkpoint: str = ""  # "", reentrant or non_reentrant
    oom: bool = False  # a memory cap and batches that grow until one does not fit
    steps: int = 3


FIXTURES = {
    "set_to_none": Fixture(),
    "keep_grads": Fixture(set_to_none=False),
    "accumulate": Fixture(micro=3),
    "amp_scaler": Fixture(optimizer="adam_foreach", amp=True),
    "ckpt_reentrant": Fixture(model="transformer", checkpoint="reentrant"),
    "ckpt_non_reentrant": Fixture(model="transformer", checkpoint="non_reentrant"),
    "adam_foreach": Fixture(optimizer="adam_foreach"),
    "adam_fused": Fixture(optimizer="adam_fused"),
    "sgd_momentum": Fixture(optimizer="sgd_momentum"),
    "oom": Fixture(oom=True, steps=8),
}
WIDTH, DEPTH, BATCH = 1024, 4, 512
D_MODEL, SEQ, T_BATCH = 256, 128, 16
OOM_CAP = 768 * 2**20  # the OOM fixture's memory cap (bytes), set as a fraction


def rounded(n: int) -> int:
    return (n + 511) // 512 * 512


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(DEPTH):
            layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(x))
        return out


class Encoder(nn.Module):
    """Two TransformerEncoderLayers (as in issue 21), checkpointed or not."""

    def __init__(self, checkpoint: str) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.inp = nn.Linear(D_MODEL, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, 4, 4 * D_MODEL, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(D_MODEL, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)  # needs grad, so reentrant checkpointing has an input to follow
        for layer in self.layers:
            if self.checkpoint:
                reentrant = self.checkpoint == "reentrant"
                h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=reentrant)
            else:
                h = layer(h)
        out: torch.Tensor = self.head(h.mean(1))
        return out


@dataclass
class Parts:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    criterion: nn.Module


def build(fx: Fixture, device: str) -> Parts:
    torch.manual_seed(0)
    model = (MLP() if fx.model == "mlp" else Encoder(fx.checkpoint)).to(device)
    params = list(model.parameters())
    optimizer: torch.optim.Optimizer
    if fx.optimizer == "adamw":
        optimizer = torch.optim.AdamW(params, lr=1e-3)
    elif fx.optimizer == "adam_foreach":
        optimizer = torch.optim.Adam(params, lr=1e-3, foreach=True)
    elif fx.optimizer == "adam_fused":
        optimizer = torch.optim.Adam(params, lr=1e-3, fused=True)
    else:
        optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    scaler = torch.amp.GradScaler(device) if fx.amp else None
    return Parts(model, optimizer, scaler, nn.CrossEntropyLoss())


def batch(fx: Fixture, step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    n = (BATCH << step) if fx.oom else BATCH
    if fx.model == "mlp":
        x = torch.randn(n, WIDTH, device=device)
    else:
        x = torch.randn(T_BATCH if not fx.oom else n // 32, SEQ, D_MODEL, device=device)
    y = torch.randint(0, 10, (x.shape[0],), device=device)
    return x, y


def train(fx: Fixture, parts: Parts, device: str, inputs: Any = None) -> int:
    """The loop; ``inputs(x, y)`` is told of each micro-batch. The steps completed."""
    model, optimizer, scaler = parts.model, parts.optimizer, parts.scaler
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    done = 0
    for step in range(fx.steps):
        for _ in range(fx.micro):
            x, y = batch(fx, step, device)
            if inputs is not None:
                inputs(x, y)
            with torch.autocast(device, dtype=dtype, enabled=fx.amp):
                loss = parts.criterion(model(x), y) / fx.micro
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            del x, y
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=fx.set_to_none)
        done += 1
    return done


def exact(parts: Parts, device_type: str) -> dict[str, int]:
    """Parameter (and buffer), gradient and optimizer-state bytes alive now, by identity."""
    seen: dict[int, tuple[str, int]] = {}

    def add(t: Any, category: str) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == device_type:
            st = t.untyped_storage()
            if st.nbytes():
                seen.setdefault(st.data_ptr(), (category, rounded(st.nbytes())))

    for p in parts.model.parameters():
        add(p, P)
    for b in parts.model.buffers():
        add(b, P)
    for p in parts.model.parameters():
        add(p.grad, G)
    for state in parts.optimizer.state.values():
        for v in state.values():
            add(v, S)
    out = dict.fromkeys((P, G, S), 0)
    for category, size in seen.values():
        out[category] += size
    return out


def untracked(parts: Parts) -> int:
    """The allocator's bytes that no live tensor holds (library workspaces), now."""
    exact(parts, "cuda")  # gives every .grad a Python object, so gc finds it
    gc.collect()
    live: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            st = obj.untyped_storage()
            live[st.data_ptr()] = rounded(st.nbytes())
    return int(torch.cuda.memory_allocated()) - sum(live.values())


def truth(fx: Fixture, device: str, workspaces: int) -> dict[str, Any]:
    """One run of the fixture under MemTracker: the categories at the allocator's peak.

    After every op, each storage that is a parameter (or buffer), a ``.grad`` or an
    optimizer's state is named so by identity, for its whole life: a gradient is an op's
    output until autograd accumulates it, SGD's momentum a clone until its step ends, and
    both count as such at a peak between. The moment taken is the allocator's high point
    as seen op by op: MemTracker's total after each op plus that op's own scratch (what
    the allocator held within the op beyond what it holds after it: buffers the op made
    and freed itself, no tensor, so MemTracker's own peak misses them; on CUDA only). The
    storages alive then are kept, and counted by those names once the run is over; the
    rest by MemTracker's own attribution (its activations and inputs; temporaries: what is
    left, plus the op's scratch and the workspaces)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    parts = build(fx, device)
    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    attr = "_vramlab_category"

    def name() -> None:
        named: list[tuple[Any, str]] = []
        named += [(p, P) for p in parts.model.parameters()]
        named += [(b, P) for b in parts.model.buffers()]
        named += [(p.grad, G) for p in parts.model.parameters()]
        for state in parts.optimizer.state.values():
            named += [(v, S) for v in state.values()]
        for t, category in named:
            if isinstance(t, torch.Tensor) and t.device.type == dev.type:
                found = tracker._WINFO.get(t.untyped_storage())
                if found is not None and getattr(found[0], attr, None) is None:
                    setattr(found[0], attr, category)

    cuda = dev.type == "cuda"

    class Truth(MemTracker):
        best = -1
        total = 0
        scratch = 0  # at the best moment: the op's own buffers, freed within it
        op_scratch = 0  # the op just run's
        alive: list[Any] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if not cuda:
                return super().__torch_dispatch__(func, types, args, kwargs)

            def measured(*a: Any, **k: Any) -> Any:
                # The allocator's high point within the op, over what it holds after it:
                # buffers the op made and freed itself (a reduction's or a kernel's
                # scratch), which are no tensor, so MemTracker never sees them.
                torch.cuda.reset_peak_memory_stats(dev)
                out = func(*a, **k)
                high = torch.cuda.max_memory_allocated(dev)
                self.op_scratch = max(0, high - torch.cuda.memory_allocated(dev))
                return out

            return super().__torch_dispatch__(measured, types, args, kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            name()
            scratch, self.op_scratch = self.op_scratch, 0
            snap = self._curr_mem_snap.get(dev)
            if snap and snap["Total"] + scratch > self.best:
                self.best = snap["Total"] + scratch
                self.total, self.scratch = snap["Total"], scratch
                self.alive = [w for w, _ in self._WINFO.values() if w.device == dev]

    tracker = Truth()
    tracker.track_external(parts.model, parts.optimizer)

    def inputs(x: torch.Tensor, y: torch.Tensor) -> None:
        reset = getattr(tracker, "reset_mod_stats", None)
        if reset is not None:
            reset()  # its per-module stats allow one forward each
        tracker.track_external(x, y)

    steps = 0
    with tracker:
        try:
            steps = train(fx, parts, device, inputs)
        except torch.OutOfMemoryError:
            steps = -1
    name()
    cats = dict.fromkeys(CATEGORIES, 0)
    mt: dict[str, int] = {}
    for w in tracker.alive:
        kind = str(getattr(w.reftype, "value", w.reftype))
        mt[kind] = mt.get(kind, 0) + w.mem_consumed
        category = getattr(w, attr, None)
        if category is None:
            category = {"Activation": A, "Other": OTHER}.get(kind, T)
        cats[category] += w.mem_consumed
    cats[T] += workspaces + tracker.scratch
    return {
        "categories": cats,
        "memtracker": mt,
        "memtracker_peak": tracker.total,
        "workspaces": workspaces,
        "op_scratch": tracker.scratch,
        "steps": steps,
    }


def main(argv: list[str]) -> int:
    """The program ``vramlab record`` records: one fixture, as a user's script."""
    fx = FIXTURES[argv[0]]
    if fx.oom:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(OOM_CAP / total)
    train(fx, build(fx, "cuda"), "cuda")
    torch.cuda.synchronize()
    print("trained")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
