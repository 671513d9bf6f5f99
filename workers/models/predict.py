"""Predict a model experiment's peak without a device: its step, traced on fake tensors.

The model is built as the worker builds it (workers/models/build.py), under PyTorch's
FakeTensorMode: every tensor has its shape, dtype and storage size, and none has memory.
The optimizer's state is made as step 1 leaves it, then the reported step runs under the
category tally (workers/models/tally.py) with the CUDA caching allocator's 512-byte
rounding, which gives the peak and what held it. What no tensor holds is added from
what was measured on GPUs (cuBLAS's workspaces: one per thread that runs matmuls).

On CUDA the reserved peak is predicted too: the build and steps 1 and 2 are logged in
the order they allocate and free (workers/models/alloc_log.py) and replayed through a
model of the caching allocator (workers/models/caching_allocator.py) with the spec's
allocator settings, under ``capacity_bytes`` where the spec sets one (then the figure
is what the capped allocator reserves, above the cap only where the step cannot fit).

Run as ``python -m workers.models.predict``: a server of JSON lines on stdin/stdout,
one request ``{"id", "params", "device"}`` and one answer per line, for the API's warm
predictor child (app/experiments/predictor.py). The API never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from app.catalog import CatalogError
from app.catalog.model_zoo import resolve_spec
from vramlab.contract import Category
from workers.models.alloc_log import (
    TRACED_DEPTH,
    AllocationLog,
    NotRegular,
    blocks_of,
    deepen,
    mark_windows,
)
from workers.models.build import DEFAULT_NEW_TOKENS, DEFAULT_SEQ_LEN, Built, build
from workers.models.caching_allocator import CachingAllocator, Settings, replay
from workers.models.cuda_semantics import CudaSemantics
from workers.models.steps import run_step, tally_step
from workers.models.tally import BLOCK, rounded

MiB = 2**20
# cuBLAS's workspace on CUDA (PyTorch's default size on Hopper), one per handle: the main
# thread's, and for training autograd's backward thread's own.
CUBLAS_WORKSPACE = 32 * MiB
SEGMENT = 2 * MiB
CAVEATS = (
    "predicted by running the step on fake tensors (no device) with the CUDA caching "
    "allocator's rounding; library workspaces are added from measurements on an H100; "
    "reserved by replaying the build and steps 1 and 2 through a model of the caching "
    "allocator (kernels' internal buffers are not in that replay)",
)
ROUNDED_CAVEAT = (
    "reserved is the peak allocated rounded up to the allocator's 2 MiB segments "
    "(a floor: the allocator's own choices are not replayed for this task or backend)"
)
CPU_CAVEAT = (
    "on the CPU, oneDNN's and other kernels' internal buffers are not predicted; "
    "the measured peak can be higher"
)


class FakeScaler:
    """GradScaler's memory without its host syncs (fake tensors have no values): the
    loss scaled, the gradients unscaled and checked in place, then the step."""

    def __init__(self, device: torch.device) -> None:
        self.scale_value = torch.full((), 65536.0, device=device)
        self.found_inf = torch.zeros((), device=device)
        self._unscaled = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        inv = self.scale_value.double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv)
        self._unscaled = True

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._unscaled:
            self.unscale_(optimizer)
        optimizer.step()
        self._unscaled = False

    def update(self) -> None:  # the scale stays: no values to judge it by
        return None


# Config keys that count a model's repeated blocks. A stack of identical blocks adds the
# same bytes per block to every phase's peak, so a deep model is traced at two shallow
# depths and each phase's peak extended in a straight line (exact on GPT-2, BERT and
# Llama stacks against tracing them whole); the largest phase wins.
LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")
SHALLOW = (2, 3)
DEEP_ENOUGH = 6  # fewer blocks than this are traced whole


@dataclass
class Traced:
    """A step traced on fake tensors: what held memory at its peak, and on CUDA the
    allocation log of the build and steps 1 and 2 at full depth (None where the
    allocator is not replayed: on the CPU, for generation, for another backend)."""

    categories: dict[str, int]
    phase: str
    caveats: list[str]
    cuda: bool
    events: list[tuple[int, int]] | None = None
    settings: Settings | None = None

    @property
    def peak_allocated(self) -> int:
        return sum(self.categories.values())

    def peak_reserved(self, capacity: int | None = None) -> int:
        """The reserved peak; under ``capacity``, what a capped allocator reserves."""
        if not self.cuda:
            return self.peak_allocated
        if self.events is None or self.settings is None:
            return rounded(self.peak_allocated, SEGMENT)
        return reserved_peak(self.events, self.settings, capacity)


def predict(
    params: Mapping[str, Any], device_type: str, allocator: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The reported step's predicted peak allocated and reserved (under the spec's
    ``capacity_bytes``, if any), and its categories. ``allocator``: the spec's
    caching-allocator settings."""
    started = time.perf_counter()
    traced = trace(params, device_type, allocator)
    capacity = params.get("capacity_bytes")
    paged = paged_state_bytes(params)
    if paged:
        traced.caveats.append(
            f"the paged optimizer's state ({paged} bytes) lives in CUDA managed memory: not in "
            "these figures; the driver moves it to the host when the GPU runs short"
        )
    return {
        "paged_optimizer_state_bytes": paged,
        "peak_allocated": traced.peak_allocated,
        "peak_reserved": traced.peak_reserved(capacity if isinstance(capacity, int) else None),
        "categories": {str(k): int(v) for k, v in traced.categories.items()},
        "caveats": traced.caveats,
        "phase": traced.phase,
        "seconds": round(time.perf_counter() - started, 3),
    }


def paged_state_bytes(params: Mapping[str, Any]) -> int:
    """What a paged optimizer keeps in managed memory (bitsandbytes' rule,
    workers/models/rules.py), from the model's trainable parameters on fake tensors."""
    if params.get("optimizer") not in ("paged-adamw-8bit", "paged-adamw"):
        return 0
    with FakeTensorMode(allow_non_fake_inputs=True):
        built = build(params, torch.device("cpu"), initialize=False)
        _prime(built)
    optimizer = built.optimizer
    return int(getattr(optimizer, "paged_bytes", 0))


def trace(
    params: Mapping[str, Any], device_type: str, allocator: Mapping[str, Any] | None = None
) -> Traced:
    """The spec's reported step traced on fake tensors (see ``Traced``)."""
    cuda = device_type == "cuda"
    if cuda and params.get("optimizer_impl", "default") == "default":
        # PyTorch's default on CUDA is the foreach implementation (for-loop on the CPU).
        params = {**params, "optimizer_impl": "foreach"}
    new_tokens = int(params.get("new_tokens") or DEFAULT_NEW_TOKENS)
    resolved = resolve_spec(params.get("model"), params.get("head"), params.get("config_json"))
    causal = resolved.kind == "causal-lm"
    settings = _settings(allocator) if cuda else None
    events: list[tuple[int, int]] | None = None
    if params.get("task") == "generate" and new_tokens > 2 and causal:
        # The prefill, and the last decoded token (its KV cache is the largest): a
        # prefill of all but the last two tokens then one decoded token holds what the
        # last step of the whole generation holds, without tracing every step before it.
        seq_len = int(params.get("seq_len") or DEFAULT_SEQ_LEN)
        first, _ = _phases({**params, "new_tokens": 1}, cuda)
        last, _ = _phases({**params, "seq_len": seq_len + new_tokens - 2, "new_tokens": 2}, cuda)
        phases = {"prefill": first["prefill"], "decode": last["decode"]}
    else:
        logged = settings is not None and params.get("task") != "generate"
        phases, events = _phases(params, cuda, logged)
    phase = max(phases, key=lambda name: sum(phases[name].values()))
    categories = {str(k): v for k, v in phases[phase].items()}
    caveats = list(CAVEATS) if cuda else [CPU_CAVEAT]
    if cuda:
        task = str(params.get("task", "train"))
        workspace = CUBLAS_WORKSPACE * (2 if task == "train" else 1)
        temporaries = str(Category.TEMPORARIES)
        categories[temporaries] = categories.get(temporaries, 0) + workspace
        if events is None:
            caveats.append(ROUNDED_CAVEAT)
    return Traced(categories, phase, caveats, cuda, events, settings)


Phases = dict[str, dict[str, int]]


def _phases(
    params: Mapping[str, Any], cuda: bool, logged: bool = False
) -> tuple[Phases, list[tuple[int, int]] | None]:
    """Each phase's peak by category: traced whole, or for a deep stack of identical
    blocks, traced at two shallow depths and extended. ``logged``: also the allocation
    log of the build and steps 1 and 2 at the model's full depth (from the 3-block trace,
    deepened; traced whole where its blocks do not repeat cleanly)."""
    depth = _depth(params)
    if depth is None:
        phases, log = _trace(params, cuda, logged)
        return phases, None if log is None else [(e.key, e.nbytes) for e in log.events]
    key, layers = depth
    shallow = []
    events = None
    for n in SHALLOW:
        config = {**(params.get("config") or {}), key: n}
        phases, log = _trace({**params, "config": config}, cuda, logged and n == TRACED_DEPTH, n)
        shallow.append(phases)
        if log is not None:
            try:
                events = deepen(log.events, layers)
            except NotRegular:
                _, whole = _trace(params, cuda, True)
                assert whole is not None
                events = [(e.key, e.nbytes) for e in whole.events]
    return _extend(shallow, layers), events


def _trace(
    params: Mapping[str, Any], cuda: bool, logged: bool = False, blocks: int | None = None
) -> tuple[Phases, AllocationLog | None]:
    """Each phase's peak, by category, from the step traced on fake tensors; with
    ``logged``, the allocation log of the build, step 1 and that step (its events tagged
    with the block of a stack of ``blocks`` they happen in)."""
    semantics = CudaSemantics() if cuda else None
    log = AllocationLog(workspace=CUBLAS_WORKSPACE if cuda else 0) if logged else None
    with FakeTensorMode(allow_non_fake_inputs=True):
        with contextlib.ExitStack() as logging:
            if log is not None:
                logging.enter_context(log)
                logging.enter_context(log.during("build"))
            built = build(params, torch.device("cpu"), initialize=False)
        if built.scaler is not None:
            built.scaler = FakeScaler(built.device)
        if semantics is not None:
            built.autocast_with = semantics.autocast
            semantics.checkpointing(built.model)
        if log is None:
            _prime(built)
        else:
            stacks = blocks_of(built.model, blocks) if blocks else []
            for s, stack in enumerate(stacks):
                for b, block in enumerate(stack):
                    log.own([*block.parameters(), *block.buffers()], (s, b))
            mark_windows(log, stacks)
            with semantics or contextlib.nullcontext(), log:
                run_step(built, log.during)  # step 1: the optimizer's state is made in it
        phases = tally_step(built, BLOCK if cuda else 1, semantics, log).phases
        if log is not None:
            log.close()  # what dies after step 2 (the model, as the trace ends) is not in it
            _drop_host_tensors(built, log)
    return phases, log


def _drop_host_tensors(built: Built, log: AllocationLog) -> None:
    """Take out of the log what lives in host memory on CUDA: the optimizer's step
    counts, unless the optimizer is fused or capturable (then they are on the device)."""
    optimizer = built.optimizer
    if optimizer is None:
        return
    if any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups):
        return
    steps = [
        v
        for state in optimizer.state.values()
        for k, v in state.items()
        if k == "step" and isinstance(v, torch.Tensor)
    ]
    host = log.keys_of(steps)
    log.events = [e for e in log.events if e.key not in host]


def _settings(allocator: Mapping[str, Any] | None) -> Settings | None:
    """The allocator model's settings for the spec's (None: a backend it does not model)."""
    if allocator and allocator.get("backend") not in (None, "native"):
        return None
    return Settings.from_spec(allocator)


def reserved_peak(
    events: list[tuple[int, int]], settings: Settings, capacity: int | None = None
) -> int:
    """The reserved peak of ``events`` replayed through the allocator model; under a
    capacity, what the capped allocator reserves (releasing its cache and retrying as
    CUDA's does), or where even that runs out, the uncapped peak (above the capacity)."""
    sequence = [(key, nbytes, 0) for key, nbytes in events]
    if capacity is not None:
        capped = replay(sequence, CachingAllocator(settings, fraction_limit=capacity))
        if not capped.oom:
            return capped.peak_reserved
    return replay(sequence, CachingAllocator(settings)).peak_reserved


def _depth(params: Mapping[str, Any]) -> tuple[str, int] | None:
    """The key and count of a deep model's repeated blocks (None: trace it whole)."""
    from workers.models.build import config_of

    _, config = config_of(params)
    keys = [k for k in LAYER_KEYS if isinstance(getattr(config, k, None), int)]
    if len(keys) != 1 or getattr(config, "num_decoder_layers", None) not in (
        None,
        getattr(config, keys[0]),
    ):
        return None
    layers = int(getattr(config, keys[0]))
    return (keys[0], layers) if layers >= DEEP_ENOUGH else None


def _extend(shallow: list[dict[str, dict[str, int]]], layers: int) -> dict[str, dict[str, int]]:
    """Each phase's categories at ``layers`` blocks, on the line through the two depths."""
    (a, b), (n_a, n_b) = shallow, SHALLOW
    out: dict[str, dict[str, int]] = {}
    for phase in a.keys() & b.keys():
        out[phase] = {
            k: max(0, a[phase][k] + (b[phase][k] - a[phase][k]) * (layers - n_a) // (n_b - n_a))
            for k in a[phase]
        }
    return out


def _prime(built: Built) -> None:
    """The state step 1 leaves: the optimizer's state made (by one step on zero
    gradients), gradients dropped again. Inference and generation keep nothing."""
    if built.optimizer is None:
        return
    for p in built.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    ident = request.get("id")
    try:
        params = request["params"]
        device = str(request.get("device") or "cuda")
        return {"id": ident, **predict(params, device, request.get("allocator"))}
    except CatalogError as exc:
        return {"id": ident, "error": {"field": exc.field, "message": exc.message}}
    except Exception as exc:  # a model the tracer cannot follow: the spec is still fine
        return {
            "id": ident,
            "error": {
                "field": "params",
                "message": f"this model's step could not be predicted: {type(exc).__name__}: "
                f"{str(exc)[:500]}",
                "unpredictable": True,
            },
        }


def serve() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            continue
        sys.stdout.write(json.dumps(answer(request)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
