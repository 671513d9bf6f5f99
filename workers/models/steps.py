"""One step of a model experiment: a training step, a forward pass, or a generation.

The step names its phases through ``phase(name)``, a context manager the caller gives:
the worker measures each phase with the allocator's counters, the predictor tallies
fake tensors per phase, and the category tally labels what each phase makes. The same
code runs in all three, so what is predicted is what is measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from workers.models import finetune, parallel
from workers.models.build import Built
from workers.models.kernel_scratch import KernelScratch
from workers.models.tally import OTHER, Peak, Tally, identities

Phase = Callable[[str], AbstractContextManager[Any]]
# A phase's start in ``Peak.phases`` (``backward@start``): a moment the predictor extends
# beside each phase's peak (workers/models/predict.py).
START = "@start"


@contextmanager
def _no_phase(name: str) -> Iterator[None]:
    yield


def run_step(built: Built, phase: Phase = _no_phase) -> None:
    """Run one step of the spec's task."""
    if built.task == "train":
        train_step(built, phase)
    elif built.task == "inference":
        with torch.no_grad(), phase("forward"), built.autocast():
            out = built.model(**built.inputs, **inference_kwargs(built))
        del out
    else:
        generate(built, phase)


def inference_kwargs(built: Built) -> dict[str, Any]:
    """The forward's cache and kept logits where the spec sets them (else the model's own
    defaults: its config's use_cache, all logits)."""
    kwargs: dict[str, Any] = {}
    if built.tune.use_cache is not None:
        kwargs["use_cache"] = built.tune.use_cache
    if built.tune.logits_to_keep is not None and built.keeps_logits:
        kwargs["logits_to_keep"] = built.tune.logits_to_keep
    return kwargs


def train_step(built: Built, phase: Phase) -> None:
    """Forward, loss and backward per micro-batch (gradients accumulate), then the
    optimizer's step; gradients are dropped at the start (``set_to_none``), as a training
    loop that zeroes them before its forward does."""
    assert built.optimizer is not None
    built.optimizer.zero_grad(set_to_none=True)
    parts = built.micro_batches
    chunks = {k: v.chunk(parts) for k, v in built.inputs.items()}
    for i in range(parts):
        batch = {k: v[i] for k, v in chunks.items()}
        with phase("forward"):
            with built.autocast():
                out = built.model(**batch)
            if built.tune.trainer and built.autocast_dtype is not None:
                out = in_float32(out)
            loss = out.loss
            del out
            if parts > 1:
                loss = loss / parts
        with phase("backward"):
            if built.scaler is not None:
                built.scaler.scale(loss).backward()
            else:
                loss.backward()
        del loss
    with phase("optimizer"):
        if built.tune.max_grad_norm is not None:  # Trainer's clipping, before the step
            if built.scaler is not None:
                built.scaler.unscale_(built.optimizer)
            torch.nn.utils.clip_grad_norm_(built.trainable(), built.tune.max_grad_norm)
        if built.scaler is not None:
            built.scaler.step(built.optimizer)
            built.scaler.update()
        else:
            built.optimizer.step()


def in_float32(out: Any) -> Any:
    """The forward's half-precision outputs as float32 copies (the logits): Trainer's
    bf16/fp16 runs the model through accelerate, whose ``convert_outputs_to_fp32`` wraps
    the autocast forward so; the copies live until the loss is taken from them."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    if isinstance(out, Mapping):
        kind: Any = type(out)  # a ModelOutput, a dict: each takes a mapping
        return kind({k: in_float32(v) for k, v in out.items()})
    if isinstance(out, tuple | list):
        return type(out)(in_float32(v) for v in out)
    return out


def generate(built: Built, phase: Phase) -> None:
    """Greedy decoding with a KV cache: the prefill, then ``new_tokens`` one at a time
    (transformers' generate does the same work; this loop has no data-dependent stop, so
    it also runs on fake tensors)."""
    model: Any = built.model
    ids = built.inputs["input_ids"]
    seq2seq = built.resolved.kind == "seq2seq-lm"
    if built.tune.use_cache is False and not seq2seq:
        generate_uncached(built, phase)
        return
    keep = built.tune.logits_to_keep if built.tune.logits_to_keep is not None else 1
    with torch.no_grad(), built.autocast():
        with phase("prefill"):
            if seq2seq:
                encoder: Any = model.get_encoder()
                encoded = encoder(input_ids=ids)
                start = torch.zeros(ids.shape[0], 1, dtype=ids.dtype, device=ids.device)
                out = model(encoder_outputs=encoded, decoder_input_ids=start, use_cache=True)
            else:
                extra = {"logits_to_keep": keep} if built.keeps_logits else {}
                out = model(input_ids=ids, use_cache=True, **extra)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            del out
        with phase("decode"):
            for _ in range(built.new_tokens - 1):
                if seq2seq:
                    out = model(
                        encoder_outputs=encoded,
                        decoder_input_ids=token,
                        past_key_values=cache,
                        use_cache=True,
                    )
                else:
                    out = model(input_ids=token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                del out
    del cache, token


def generate_uncached(built: Built, phase: Phase) -> None:
    """Greedy decoding without a KV cache: every token runs the whole sequence so far."""
    model: Any = built.model
    ids = built.inputs["input_ids"]
    keep = built.tune.logits_to_keep if built.tune.logits_to_keep is not None else 1
    extra = {"logits_to_keep": keep} if built.keeps_logits else {}
    with torch.no_grad(), built.autocast():
        for i in range(built.new_tokens):
            with phase("prefill" if i == 0 else "decode"):
                out = model(input_ids=ids, use_cache=False, **extra)
                token = out.logits[:, -1:].argmax(-1)
                del out
                ids = torch.cat([ids, token], dim=1)
    del ids


def _both(first: Phase, second: Phase) -> Phase:
    @contextmanager
    def both(name: str) -> Iterator[None]:
        with first(name), second(name):
            yield

    return both


def tokens_per_step(built: Built) -> int | None:
    if built.resolved.kind == "image-classification":
        return None
    if built.task == "generate":
        return built.batch_size * built.new_tokens
    return built.batch_size * built.seq_len


def tally_step(
    built: Built,
    block: int,
    around: AbstractContextManager[Any] | None = None,
    log: Any = None,
    recorded: bool = False,
    kernels: bool = False,
) -> Peak:
    """One more step under the category tally (workers/models/tally.py): what held memory
    at its peak. What exists before it (parameters, optimizer state, inputs, buffers) is
    counted from the start; ``around`` wraps the step (the predictor's CUDA semantics);
    ``log``, an allocation log (workers/models/alloc_log.py), records it too; with
    ``recorded``, the peak carries the tally's record and its storages' categories by
    their names in it (to replay the step at another batch, workers/models/families.py);
    with ``kernels``, the buffers CUDA's kernels take for themselves are made inside the ops
    that take them (a prediction for CUDA: workers/models/kernel_scratch.py; the allocation
    log does not see them)."""
    tally = Tally(block, recorded)
    tally.adopt([*built.parameters(), *built.optimizer_state(), *built.inputs.values()])
    tally.adopt(built.held)
    tally.adopt(built.model.buffers())
    scaler = built.scaler
    for held in ("scale_value", "found_inf"):  # the predictor's stand-in GradScaler
        if isinstance(getattr(scaler, held, None), torch.Tensor):
            tally.adopt([getattr(scaler, held)])
    with contextlib.ExitStack() as stack:
        stack.enter_context(around or contextlib.nullcontext())
        stack.enter_context(tally)
        if kernels:
            stack.enter_context(KernelScratch(tally))
        stack.enter_context(finetune.step_untallied(built.optimizer))
        if built.params.parallel is not None:
            stack.enter_context(parallel.storage_watched(tally))
        phase: Phase = tally.during
        if log is not None:
            stack.enter_context(log)
            phase = _both(tally.during, log.during)
        run_step(built, phase)
    by_identity = identities(built.parameters(), built.gradients(), built.optimizer_state())
    peak = tally.categorize_by(by_identity)
    peak.phases = phases_of(tally, by_identity)
    record, tally.record = tally.record, None  # what ends from here is not the step's
    if record is not None:
        peak.record, peak.identities = record, record.named(by_identity)
    return peak


def phases_of(tally: Tally, by_identity: dict[int, str]) -> dict[str, dict[str, int]]:
    """Each phase's own peak by category, and its start's (``START``)."""
    phases = {
        name: tally.categorize_by(by_identity, phase=name).categories
        for name in tally.phase_peaks
        if name != OTHER
    }
    for name in tally.phase_starts:
        if name != OTHER:
            start = tally.categorize_by(by_identity, phase=name, start=True)
            phases[name + START] = start.categories
    return phases
