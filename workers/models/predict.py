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

Run as ``python -m workers.models.predict [--nice N]``: a server of JSON lines on
stdin/stdout, a ``{"ready": true}`` line once torch is imported, then one request
``{"id", "params", "device", "allocator", "limit_s"}`` and one answer per line, for the
API's warm predictor children (app/experiments/predictor_backends.py) and the predictor
service's (app/experiments/predictor_service.py). The API never imports torch. What a
spec costs to trace is judged before it is built (workers/models/cost.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vramlab.catalog.errors import CatalogError
from vramlab.catalog.model_zoo import resolve_spec
from vramlab.contract import Category
from vramlab.runspec import ModelParams
from workers.models import cost, edges, families, parallel, rules
from workers.models.alloc_log import (
    TRACED_DEPTH,
    AllocationLog,
    NotRegular,
    blocks_of,
    deepen,
    mark_windows,
)
from workers.models.build import Built, build
from workers.models.caching_allocator import CachingAllocator, Settings, replay
from workers.models.cuda_semantics import CudaSemantics
from workers.models.steps import START, run_step, tally_step
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
PASSED_LIMIT = "passed the limit"  # what a refusal for time says (the API remembers it less long)
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


# A stack of identical blocks adds the same bytes per block to every phase's peak, so a
# deep model is traced at two shallow depths and each phase's peak extended in a straight
# line (exact on GPT-2, BERT and Llama stacks against tracing them whole); the largest
# phase wins. Which models are deep, and what is too costly to trace: workers/models/cost.py.
SHALLOW = (2, 3)
# The reserved peak replays the deepened allocation log; past this depth it is replayed at
# half and all of it and extended on the same line.
MAX_REPLAY_DEPTH = 128
# Deeper than this (no model on any card is), reserved is the allocated peak rounded up.
MAX_EXTENDED_DEPTH = 1024
# Where the shallow log's blocks do not repeat cleanly (an encoder-decoder), a model of at
# most this many blocks is traced whole for its log; a deeper one's reserved is rounded.
WHOLE_REPLAY_BLOCKS = 16
EXTENDED_CAVEAT = (
    "reserved at {depth} blocks is extended in a straight line from the allocator model's "
    "replay at {a} and {b} blocks"
)


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
    # For a stack deeper than MAX_REPLAY_DEPTH: (depth, events at half of it, its depth);
    # ``events`` is then the log at MAX_REPLAY_DEPTH.
    extended: tuple[int, list[tuple[int, int]], int] | None = None

    # The model's parameters (a 4-bit or 8-bit weight as its unquantized elements, a
    # sharded one whole) and those its optimizer trains, at its full depth.
    parameters: int | None = None
    trainable: int | None = None

    @property
    def peak_allocated(self) -> int:
        return sum(self.categories.values())

    def peak_reserved(self, capacity: int | None = None) -> int:
        """The reserved peak; under ``capacity``, what a capped allocator reserves."""
        if not self.cuda:
            return self.peak_allocated
        if self.events is None or self.settings is None:
            return rounded(self.peak_allocated, SEGMENT)
        if self.extended is not None:
            depth, half, at = self.extended
            a = reserved_peak(half, self.settings)
            b = reserved_peak(self.events, self.settings)
            return a + (b - a) * (depth - at) // (MAX_REPLAY_DEPTH - at)
        return reserved_peak(self.events, self.settings, capacity)


def predict(
    params: ModelParams | Mapping[str, Any],
    device_type: str,
    allocator: Mapping[str, Any] | None = None,
    log: bool = False,
) -> dict[str, Any]:
    """The reported step's predicted peak allocated and reserved (under the spec's
    ``capacity_bytes``, if any), and its categories. ``allocator``: the spec's
    caching-allocator settings; ``log``: also the allocation log replayed for reserved
    (packed, workers/models/edges.py; None where there is none at the model's depth)."""
    params = ModelParams.of(params)
    started = time.perf_counter()
    if params.parallel is not None and params.parallel.offload_optimizer:
        # On fake tensors the host and the device are one ("cpu"): what the offload moves
        # off the GPU cannot be told apart. The spec is measured only.
        raise NotImplementedError("FSDP's CPU offload is measured, not yet predicted")
    with parallel.fake_group(params.parallel):
        traced = trace(params, device_type, allocator)
    paged = paged_state_bytes(params)
    if paged:
        traced.caveats.append(
            f"the paged optimizer's state ({paged} bytes) lives in CUDA managed memory: not in "
            "these figures; the driver moves it to the host when the GPU runs short"
        )
    out: dict[str, Any] = {}
    if log:
        flat = traced.events is not None and traced.extended is None
        out["log"] = edges.pack(traced.events) if flat and traced.events else None
    return {
        **out,
        "paged_optimizer_state_bytes": paged,
        "peak_allocated": traced.peak_allocated,
        "peak_reserved": traced.peak_reserved(params.capacity_bytes),
        "categories": {str(k): int(v) for k, v in traced.categories.items()},
        "parameter_count": traced.parameters,
        "trainable_parameter_count": traced.trainable,
        "caveats": traced.caveats,
        "phase": traced.phase,
        "seconds": round(time.perf_counter() - started, 3),
    }


def paged_state_bytes(params: ModelParams) -> int:
    """What a paged optimizer keeps in managed memory (bitsandbytes' rule,
    workers/models/rules.py), from the model's trainable parameters on fake tensors."""
    if params.optimizer not in ("paged-adamw-8bit", "paged-adamw"):
        return 0
    with FakeTensorMode(allow_non_fake_inputs=True):
        built = build(params, torch.device("cpu"), initialize=False)
        _prime(built)
    return int(getattr(built.optimizer, "paged_bytes", 0))


def trace(
    params: ModelParams | Mapping[str, Any],
    device_type: str,
    allocator: Mapping[str, Any] | None = None,
) -> Traced:
    """The spec's reported step traced on fake tensors (see ``Traced``)."""
    params = ModelParams.of(params)
    cuda = device_type == "cuda"
    if cuda and params.optimizer_impl == "default":
        # PyTorch's default on CUDA is the foreach implementation (for-loop on the CPU).
        params = params.replace(optimizer_impl="foreach")
    new_tokens = params.new_tokens_or_default
    causal = resolve_spec(params.model, params.head, params.config_json).kind == "causal-lm"
    settings = _settings(allocator) if cuda else None
    if params.parallel is not None:  # collectives' buffers are not in the replayed log
        settings = None
    events: Logged = None
    if params.task == "generate" and new_tokens > 2 and causal:
        # The prefill, and the last decoded token (its KV cache is the largest): a
        # prefill of all but the last two tokens then one decoded token holds what the
        # last step of the whole generation holds, without tracing every step before it.
        seq_len = params.seq_len_or_default
        first, _ = _phases(params.replace(new_tokens=1), cuda)
        last, _ = _phases(params.replace(seq_len=seq_len + new_tokens - 2, new_tokens=2), cuda)
        phases = {"prefill": first["prefill"], "decode": last["decode"], COUNTS: first[COUNTS]}
    else:
        logged = settings is not None and params.task != "generate"
        phases, events = _phases(params, cuda, logged)
    counts = phases.pop(COUNTS, {})
    # Each phase's peak and its start, each extended on its own line: at a shallow depth a
    # phase can peak at a moment that grows less per block than its start does.
    moment = max(phases, key=lambda name: sum(phases[name].values()))
    categories = {str(k): v for k, v in phases[moment].items()}
    phase = moment.removesuffix(START)
    caveats = list(CAVEATS) if cuda else [CPU_CAVEAT]
    extended = events if isinstance(events, tuple) else None
    if extended is not None:
        events = extended[1]
        depth, _, at = extended[0]
        caveats.append(EXTENDED_CAVEAT.format(depth=depth, a=at, b=MAX_REPLAY_DEPTH))
    if cuda:
        workspace = CUBLAS_WORKSPACE * (2 if params.task == "train" else 1)
        temporaries = str(Category.TEMPORARIES)
        categories[temporaries] = categories.get(temporaries, 0) + workspace
        if events is None:
            caveats.append(ROUNDED_CAVEAT)
    replayed = None if extended is None else extended[0]
    flat = None if isinstance(events, tuple) else events
    return Traced(
        categories,
        phase,
        caveats,
        cuda,
        flat,
        settings,
        replayed,
        counts.get("parameters"),
        counts.get("trainable"),
    )


Phases = dict[str, dict[str, int]]
# Not a phase: the model's parameter counts, kept beside the phases' categories so that a
# deep model's are extended from its shallow traces along the same line (exact: every
# block holds the same parameters).
COUNTS = "counts"
Events = list[tuple[int, int]]
# The allocation log to replay; for a stack past MAX_REPLAY_DEPTH, ((depth, the log at
# half of MAX_REPLAY_DEPTH, that half), the log at MAX_REPLAY_DEPTH).
Logged = Events | tuple[tuple[int, Events, int], Events] | None


def _phases(
    params: ModelParams | Mapping[str, Any], cuda: bool, logged: bool = False
) -> tuple[Phases, Logged]:
    """Each phase's peak by category: traced whole, or for a deep model, traced at shallow
    depths and extended (workers/models/cost.py decides which, or refuses). ``logged``: also
    the allocation log of the build and steps 1 and 2 at the model's full depth (from the
    3-block trace, deepened; traced whole where its blocks do not repeat cleanly and the
    model is shallow enough)."""
    params = ModelParams.of(params)
    from workers.models.build import config_of

    params = ModelParams.of(params)
    _, config = config_of(params)
    how = cost.plan(config, params.config_overrides)
    if not how.shallow:
        phases, log = _trace(params, cuda, logged)
        return phases, None if log is None else [(e.key, e.nbytes) for e in log.events]
    if not how.uniform:
        return _extend_stacks(params, cuda, how.depths), None
    layers = next(iter(how.depths.values()))
    shallow = []
    events: Logged = None
    depths = list(SHALLOW)
    for n in SHALLOW:
        config = {**params.config_overrides, **dict.fromkeys(how.depths, n)}
        phases, log = _trace(params.replace(config=config), cuda, logged and n == TRACED_DEPTH, n)
        shallow.append(phases)
        if log is not None:
            events = _deepened(params, cuda, log, layers, how.blocks)
    if layers > SHALLOW[-1] + 1 and _moved(*shallow):
        # At two blocks the peak can fall at another moment of the step than at three or
        # more (no middle block: T5 with dropout and short targets peaks in its backward
        # with gradients still held): the line then runs through three and four.
        n = SHALLOW[-1] + 1
        config = {**params.config_overrides, **dict.fromkeys(how.depths, n)}
        phases, _ = _trace(params.replace(config=config), cuda, False, n)
        shallow, depths = [shallow[-1], phases], [SHALLOW[-1], n]
    return _extend(shallow, layers, (depths[0], depths[1])), events


def _moved(a: Phases, b: Phases) -> bool:
    """Whether a phase's peak holds less of some category at the deeper trace ``b`` than
    at ``a``: more blocks never hold less at the same moment, so the peak moved."""
    return any(b[phase].get(k, 0) < v for phase in a.keys() & b.keys() for k, v in a[phase].items())


def _deepened(
    params: ModelParams, cuda: bool, log: AllocationLog, layers: int, blocks: int
) -> Logged:
    """The shallow log deepened to ``layers`` (past MAX_REPLAY_DEPTH, to it and its half
    for a straight line); where its blocks do not repeat cleanly, the model traced whole if
    it is shallow enough to trace, else nothing (reserved is then rounded up)."""
    try:
        if layers <= MAX_REPLAY_DEPTH:
            return deepen(log.events, layers)
        if layers > MAX_EXTENDED_DEPTH:  # far past any card: its reserved is rounded up
            return None
        half = MAX_REPLAY_DEPTH // 2
        return (layers, deepen(log.events, half), half), deepen(log.events, MAX_REPLAY_DEPTH)
    except NotRegular:
        if blocks > WHOLE_REPLAY_BLOCKS:
            return None
        _, whole = _trace(params, cuda, True)
        assert whole is not None
        return [(e.key, e.nbytes) for e in whole.events]


def _extend_stacks(
    params: ModelParams | Mapping[str, Any], cuda: bool, depths: Mapping[str, int]
) -> Phases:
    """Stacks of different depths (an encoder and a decoder): traced with every stack at 2
    blocks, then each at 3 in turn, and each phase's categories extended along each stack's
    own line."""
    params = ModelParams.of(params)
    low, high = SHALLOW
    overrides = params.config_overrides
    base, _ = _trace(params.replace(config={**overrides, **dict.fromkeys(depths, low)}), cuda)
    out = {phase: dict(categories) for phase, categories in base.items()}
    for key, layers in depths.items():
        config = {**overrides, **dict.fromkeys(depths, low), key: high}
        deeper, _ = _trace(params.replace(config=config), cuda)
        for phase in out.keys() & deeper.keys():
            for k in out[phase]:
                step = deeper[phase].get(k, 0) - base[phase][k]
                out[phase][k] = max(0, out[phase][k] + step * (layers - low))
    return out


def _trace(
    params: ModelParams | Mapping[str, Any],
    cuda: bool,
    logged: bool = False,
    blocks: int | None = None,
) -> tuple[Phases, AllocationLog | None]:
    """Each phase's peak, by category, from the step traced on fake tensors; with
    ``logged``, the allocation log of the build, step 1 and that step (its events tagged
    with the block of a stack of ``blocks`` they happen in). Another batch size of a
    family this process traced at three is not traced again (workers/models/families.py)."""
    params = ModelParams.of(params)
    family = families.key_of(params, cuda, logged, blocks)
    reused = FAMILIES.answer(family, params.batch_size)
    if reused is not None:
        phases, counts, made = reused
        return {**phases, COUNTS: counts}, made
    phases, log, point = _traced(params, cuda, logged, blocks, FAMILIES.wants(family))
    if family is not None and point is not None:
        FAMILIES.learn(family, params.batch_size, point)
    return phases, log


FAMILIES = families.Families()  # this process's traces, reused across batch sizes


def _traced(
    params: ModelParams, cuda: bool, logged: bool, blocks: int | None, recorded: bool
) -> tuple[Phases, AllocationLog | None, families.Point | None]:
    """``_trace``'s trace; with ``recorded``, also what replays it at another batch size
    (None where it cannot be replayed)."""
    semantics = CudaSemantics() if cuda else None
    log = AllocationLog(workspace=CUBLAS_WORKSPACE if cuda else 0) if logged else None
    with FakeTensorMode(allow_non_fake_inputs=True), _unpacked():
        with contextlib.ExitStack() as logging:
            if log is not None:
                logging.enter_context(log)
                logging.enter_context(log.during("build"))
            built = _build(params)
        if isinstance(built.optimizer, rules.StateRule):
            built.optimizer.device_type = "cuda" if cuda else "cpu"  # whose kernels it rules
        if built.scaler is not None:
            built.scaler = FakeScaler(built.device)
        if semantics is not None:
            built.autocast_with = semantics.autocast
            semantics.checkpointing(built.model)
        if log is None and built.params.parallel is not None:
            with semantics or contextlib.nullcontext():
                run_step(built)  # step 1 in full: DDP's fake reducer hands its buckets over
        elif log is None:
            _prime(built)
        else:
            stacks = blocks_of(built.model, blocks) if blocks else []
            for s, stack in enumerate(stacks):
                for b, block in enumerate(stack):
                    log.own([*block.parameters(), *block.buffers()], (s, b))
            mark_windows(log, stacks)
            with semantics or contextlib.nullcontext(), log:
                run_step(built, log.during)  # step 1: the optimizer's state is made in it
        rounding = BLOCK if cuda else 1
        peak = tally_step(built, rounding, semantics, log, recorded, kernels=cuda)
        phases: Phases = {**peak.phases}
        phases[COUNTS] = parameter_counts(built.model)
        if log is not None:
            log.close()  # what dies after step 2 (the model, as the trace ends) is not in it
            _drop_host_tensors(built, log)
    point = None
    if peak.record is not None and peak.record.replayable:
        point = families.Point.of(peak, phases[COUNTS], rounding, log)
    return phases, log, point


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """The model's parameters and its trainable ones, each counted once (a tied weight
    once; a sharded one whole, as a DTensor's numel is; a quantized weight as the
    elements it stands for, not its packed bytes, as transformers' num_parameters counts
    a 4-bit one)."""
    seen: set[int] = set()
    total = trainable = 0
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            if isinstance(module, rules.QuantizedLinear) and name == "weight":
                n = module.in_features * module.out_features
            total += n
            trainable += n if p.requires_grad else 0
    return {"parameters": total, "trainable": trainable}


@contextlib.contextmanager
def _unpacked() -> Iterator[None]:
    """transformers' look for packed sequences, answered as real tensors answer it here.
    Without a KV cache or an attention mask (a training forward under Trainer, which turns
    the cache off), transformers reads the position ids to find several sequences packed in
    a row; on fake tensors it cannot read them and assumes packing, so it builds a whole
    batch x seq x seq mask and hands it to SDPA (another kernel, the mask held for the
    backward). The worker's inputs hold one sequence per row: no packing, no mask."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda ids: None):
        yield


# What fake tensors cannot do that real ones can (a value read while building): the model
# may still build and run on a worker, so the spec is measured only.
FAKE_ONLY = (
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "UnsupportedOperatorException",
    "UnsupportedFakeTensorException",
)


def _build(params: ModelParams) -> Built:
    """The model built on fake tensors; a config no model can be built with is a
    CatalogError (the spec would fail on every worker: it is refused, not queued)."""
    try:
        return build(params, torch.device("cpu"), initialize=False)
    except CatalogError:
        raise
    except Exception as exc:
        if interrupted(exc):
            raise OverLimit() from exc
        if type(exc).__name__ in FAKE_ONLY or isinstance(exc, ImportError):
            raise
        raise CatalogError(
            "params.config",
            f"this model cannot be built with this config: {type(exc).__name__}: {str(exc)[:300]}",
        ) from None


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


def _extend(
    shallow: list[dict[str, dict[str, int]]], layers: int, depths: tuple[int, int] = SHALLOW
) -> dict[str, dict[str, int]]:
    """Each phase's categories at ``layers`` blocks, on the line through the two depths."""
    (a, b), (n_a, n_b) = shallow, depths
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
    for p in built.model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)


REPEAT_S = 0.01  # CPU seconds between the limit's later signals


class OverLimit(BaseException):
    """The prediction used up its CPU time (a BaseException: no ``except Exception`` in
    the tracer or in transformers swallows it)."""


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while handling an OverLimit: the limit's raise can land
    inside a library's ``try`` whose ``finally`` then fails on its own (transformers'
    model init reads a name its ``try`` had not yet bound), and that second error is what
    reaches us. It is the limit, not the config."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, OverLimit):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


@contextlib.contextmanager
def cpu_limit(seconds: float | None) -> Iterator[None]:
    """Raise OverLimit in this thread once the process has used ``seconds`` of CPU time
    from here: a limit that a busy machine does not shorten (the wall clock would)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    armed = [True]

    def over(signum: int, frame: Any) -> None:
        if armed[0]:
            raise OverLimit()

    previous = signal.signal(signal.SIGPROF, over)
    # The timer repeats: a raise that lands in a finalizer (``__del__``, a weakref
    # callback, a garbage collection) is printed and dropped by Python, and a one-shot
    # timer would then let the trace run on to its end.
    signal.setitimer(signal.ITIMER_PROF, seconds, REPEAT_S)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def over_limit(limit: Any) -> str:
    """The refusal of a spec whose prediction used up its CPU time."""
    return (
        f"predicting this spec {PASSED_LIMIT} of {float(limit or 0):g} s of CPU time "
        f"(VRAMLAB_MODEL_PREDICT_TIMEOUT_S): it is refused; a smaller model or config "
        f"predicts in time"
    )


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """One request answered: a prediction, or ``{"error": {"field", "message"}}`` (refused;
    with ``"unpredictable": true`` where the spec may still run, measured only).
    ``limit_s``: the CPU seconds the trace may take (its model's classes are imported
    first, outside the limit: a one-time cost of this process, not of the spec)."""
    ident = request.get("id")
    limit = request.get("limit_s")
    try:
        params = ModelParams.from_wire(request["params"])
        device = str(request.get("device") or "cuda")
        _import_classes(params)
        asked = request.get("edges")
        if asked is not None:
            with cpu_limit(float(limit) if limit else None):
                return {"id": ident, **plan_edges(asked, device, request.get("allocator"))}
        with cpu_limit(float(limit) if limit else None):
            logged = bool(request.get("log"))
            return {"id": ident, **predict(params, device, request.get("allocator"), logged)}
    except OverLimit:
        return {"id": ident, "error": {"field": "params", "message": over_limit(limit)}}
    except CatalogError as exc:
        if interrupted(exc):
            return {"id": ident, "error": {"field": "params", "message": over_limit(limit)}}
        return {"id": ident, "error": {"field": exc.field, "message": exc.message}}
    except Exception as exc:  # a model the tracer cannot follow: the spec is still fine
        if interrupted(exc):
            return {"id": ident, "error": {"field": "params", "message": over_limit(limit)}}
        return {
            "id": ident,
            "error": {
                "field": "params",
                "message": f"this model's step could not be predicted: {type(exc).__name__}: "
                f"{str(exc)[:500]}",
                "unpredictable": True,
            },
        }


MAX_POINTS = 4  # traced values an edge request may carry
MAX_LOG = 4_000_000  # ints in one packed log
MAX_CAPACITIES = 64  # cards one edge request may ask about


def plan_edges(request: Mapping[str, Any], device_type: str, allocator: Any) -> dict[str, Any]:
    """Each card's edge from the logs traced at a few values (workers/models/edges.py):
    ``{"points": [[value, packed log], ...], "capacities": [...], "step", "top", "value"}``
    -> ``{"edges": [{"edge": the largest fitting multiple of step up to top (0: none),
    "reserved_at_value": what the capped allocator reserves at value}, ...]}``, one per
    capacity, each None where the logs do not line up (the caller then traces)."""
    capacities = request.get("capacities")
    if not isinstance(capacities, list) or not 1 <= len(capacities) <= MAX_CAPACITIES:
        return {"edges": None}
    none: dict[str, Any] = {"edges": [{"edge": None, "reserved_at_value": None}] * len(capacities)}
    settings = _settings(allocator) if device_type == "cuda" else None
    points = request.get("points")
    if settings is None or not isinstance(points, list) or not 2 <= len(points) <= MAX_POINTS:
        return none
    try:
        step, top, value = (int(request[k]) for k in ("step", "top", "value"))
        caps = [int(c) for c in capacities]
        if min(caps) <= 0 or not 1 <= step <= top or value < 1:
            return none
        logs = []
        for x, flat in points:
            if not isinstance(flat, list) or len(flat) > MAX_LOG:
                return none
            logs.append((int(x), edges.unpack(flat)))
    except (KeyError, TypeError, ValueError):
        return none
    fit = edges.fitted(logs)
    if fit is None:
        return none
    made: dict[int, edges.Events | None] = {}  # each value's log, shared by the cards

    def log_at(x: int) -> edges.Events | None:
        if x not in made:
            made[x] = edges.at(fit, x)
        return made[x]

    # Each card's search starts where the line through the points' reserved crosses it.
    (x1, log1), (x2, log2) = logs[0], logs[1]
    y1, y2 = reserved_peak(log1, settings), reserved_peak(log2, settings)
    slope = (y2 - y1) / (x2 - x1)

    def guess(capacity: int) -> int:
        return int(x1 + (capacity - y1) / slope) if slope > 0 else value

    out = [_edge_under(c, log_at, settings, step, top, value, guess(c)) for c in caps]
    return {"edges": out}


def _edge_under(
    capacity: int,
    log_at: Any,
    settings: Settings,
    step: int,
    top: int,
    value: int,
    guess: int,
) -> dict[str, int | None]:
    """One card's edge: a search from ``guess`` over the synthesized logs replayed under
    its capacity."""

    def fits(x: int) -> bool | None:
        events = log_at(x)
        if events is None:
            return None
        # What reserved_peak would say, without replaying uncapped where the cap is hit.
        capped = replay(
            [(key, nbytes, 0) for key, nbytes in events],
            CachingAllocator(settings, fraction_limit=capacity),
        )
        return not capped.oom and capped.peak_reserved <= capacity

    found = edges.edge(fits, step, top, guess)
    at_value = None if found is None else log_at(value)
    held = None if at_value is None else reserved_peak(at_value, settings, capacity)
    return {"edge": found, "reserved_at_value": held}


def _import_classes(params: ModelParams) -> None:
    """Import the modules of the spec's model (transformers imports them lazily)."""
    import transformers

    from workers.models.build import _AUTO, config_of

    with contextlib.suppress(Exception):  # what is wrong is said by the trace itself
        resolved, config = config_of(params)
        getattr(transformers, _AUTO[resolved.kind])._model_mapping[type(config)]


WARM_UP = {"model": "gpt2", "batch_size": 1, "seq_len": 8, "config": {"n_layer": 1}}


def serve(nice: int = 0) -> None:
    """Answer requests from stdin; first a ``{"ready": true}`` line (torch is imported)."""
    if nice:
        os.nice(nice)  # below the API that started it: reads keep their CPU
    # A first step traced warms what every later one uses (transformers' lazy imports,
    # torch's dispatch caches): a second or more that no submitter should wait for.
    answer({"params": WARM_UP, "device": "cuda"})
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
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
    import argparse

    parser = argparse.ArgumentParser(description="vramlab's model predictor (JSON lines)")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority")
    serve(parser.parse_args().nice)
