"""Build a model experiment's model, optimizer and inputs from its params.

The model comes from transformers' Auto classes: a config (a preset's, or a model_type's
defaults) with the spec's overrides, random weights, nothing downloaded. The same code
builds the worker's real model and the predictor's fake one (under FakeTensorMode).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vramlab.catalog.errors import CatalogError
from vramlab.catalog.model_zoo import Resolved, resolve_spec
from vramlab.runspec import DEFAULT_IMAGE_SIZE, ModelParams
from workers.models import finetune, rules
from workers.models.finetune import FineTune
from workers.models.parallel import local, wrap

# The child never reaches a model hub: configs are built, weights are random.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_AUTO = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST_DTYPES = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}


@dataclass
class Built:
    """What a step needs: the model, its optimizer (training), inputs, and how to run."""

    resolved: Resolved
    params: ModelParams
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scaler: Any  # torch.amp.GradScaler for fp16 autocast training, else None
    inputs: dict[str, torch.Tensor]
    device: torch.device
    autocast_dtype: torch.dtype | None
    keeps_logits: bool  # whether the forward takes logits_to_keep (generation's prefill)
    tune: FineTune = field(default_factory=FineTune)
    # Another autocast (the predictor's CUDA autocast on CPU fake tensors); None: torch's.
    autocast_with: Callable[[torch.dtype], contextlib.AbstractContextManager[Any]] | None = None
    # What a wrapper holds that no parameter reaches (the predictor's stand-ins for DDP's
    # gradient buckets): counted as gradients.
    held: list[torch.Tensor] = field(default_factory=list)

    @property
    def task(self) -> str:
        return self.params.task

    @property
    def batch_size(self) -> int:
        return self.params.batch_size

    @property
    def seq_len(self) -> int:
        return self.params.seq_len_or_default

    @property
    def micro_batches(self) -> int:
        return self.params.micro_batches

    @property
    def new_tokens(self) -> int:
        return self.params.new_tokens_or_default

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        if self.autocast_with is not None:
            return self.autocast_with(self.autocast_dtype)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def parameters(self) -> list[torch.Tensor]:
        """What this process holds of the parameters (a sharded one's local shard)."""
        return [local(p) for p in self.model.parameters()]

    def gradients(self) -> list[torch.Tensor]:
        grads = [local(p.grad) for p in self.model.parameters() if p.grad is not None]
        return grads + self.held

    def trainable(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def optimizer_state(self) -> list[torch.Tensor]:
        """The optimizer's state on the device (paged state, in managed memory, apart)."""
        return [t for t in self._state() if not finetune.is_paged(t)]

    def paged_state(self) -> list[torch.Tensor]:
        return [t for t in self._state() if finetune.is_paged(t)]

    def _state(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        return [
            leaf
            for state in self.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
            for leaf in finetune.state_tensors(local(v))
        ]


def config_of(params: ModelParams) -> tuple[Resolved, Any]:
    """The model's resolved name and its transformers config (overrides applied)."""
    import transformers

    try:
        resolved = resolve_spec(params.model, params.head, params.config_json)
    except ValueError as exc:
        raise CatalogError("params.model", str(exc)) from None
    overrides = {**resolved.config, **params.config_overrides}
    config_class = transformers.CONFIG_MAPPING[resolved.model_type]
    known = set(inspect.signature(config_class.__init__).parameters) | set(
        vars(config_class()).keys()
    )
    for key in params.config_overrides:  # for_model keeps unknown keys: say so instead
        if key not in known:
            raise CatalogError("params.config", f"{resolved.model_type} configs have no {key!r}")
    try:
        config = transformers.AutoConfig.for_model(resolved.model_type, **overrides)
    except (ValueError, TypeError, KeyError) as exc:
        raise CatalogError("params.config", f"transformers refuses this config: {exc}") from None
    if params.dropout is not None:  # the knob: every dropout probability of the config
        for key, value in finetune.dropout_overrides(config, params.dropout).items():
            setattr(config, key, value)
    if resolved.kind == "seq2seq-lm" and getattr(config, "decoder_start_token_id", None) is None:
        # Training shifts the labels right from this token; T5's configs leave it unset.
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    return resolved, config


def build(
    params: ModelParams | Mapping[str, Any], device: torch.device, initialize: bool = True
) -> Built:
    """The model (random weights, on ``device``), optimizer and one step's inputs.
    ``initialize=False`` skips drawing the weights (the predictor's fake tensors hold no
    values)."""
    params = ModelParams.of(params)
    import transformers
    from transformers.initialization import no_init_weights

    resolved, config = config_of(params)
    tune = FineTune.of(params)
    task, precision = params.task, params.precision
    auto = getattr(transformers, _AUTO[resolved.kind])
    weights = WEIGHT_DTYPES.get(precision, torch.float32)
    kwargs: dict[str, Any] = {"dtype": weights}
    if resolved.kind != "image-classification" or params.attention == "eager":
        kwargs["attn_implementation"] = params.attention
    skip = contextlib.nullcontext() if initialize else no_init_weights()
    with torch.device(device), skip:
        try:
            model = auto.from_config(config, **kwargs)
        except (ValueError, NotImplementedError) as exc:
            field = "params.attention" if "attn" in str(exc).lower() else "params.model"
            raise CatalogError(field, f"transformers cannot build this model: {exc}") from None
    if not initialize:
        model.tie_weights()  # skipped with the weights' initialization
    if tune.quantization is not None:
        q = tune.quantization
        if initialize:  # bitsandbytes quantizes as it loads: the random weights, reloaded
            model = finetune.quantized(model, auto, kwargs, q, device, task == "train")
        else:
            rules.quantize(model, q.method, q.double_quant, WEIGHT_DTYPES[q.compute_dtype])
    if tune.loss == "liger":
        if initialize:
            finetune.apply_liger(model)
        else:
            model.forward = rules.liger_forward(model)
    model.train(task == "train")
    if params.checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise CatalogError(
                "params.checkpointing", f"{resolved.model_type} has no activation checkpointing"
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if tune.dropout is not None:  # dropouts no config value reaches (training keeps masks)
        finetune.set_dropout(model, tune.dropout)
    if tune.lora is not None:
        with torch.device(device):
            model = finetune.apply_lora(model, tune.lora, fake=not initialize)
        model.train(task == "train")
    if tune.trainer_use_cache is not None and getattr(model, "config", None) is not None:
        # What Trainer does to the model it is given (its constructor's last step).
        model.config.use_cache = tune.trainer_use_cache
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, trainable, fake=not initialize) if task == "train" else None
    autocast_dtype = AUTOCAST_DTYPES.get(precision)
    scaler = None
    if task == "train" and precision == "fp16-autocast":
        scaler = torch.amp.GradScaler(device.type)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    forward_args = inspect.signature(base.forward).parameters
    built = Built(
        resolved=resolved,
        params=params,
        model=model,
        optimizer=optimizer,
        scaler=scaler,
        inputs=make_inputs(resolved.kind, config, params, device),
        device=device,
        autocast_dtype=autocast_dtype,
        keeps_logits="logits_to_keep" in forward_args,
        tune=tune,
    )
    if params.parallel is not None:  # this process is one rank of a process group
        wrap(built, params.parallel, fake=not initialize)
        # over what the wrapper trains (FSDP's parameters are now its shards, DTensors)
        trainable = [p for p in built.model.parameters() if p.requires_grad]
        built.optimizer = make_optimizer(params, trainable, fake=not initialize)
    return built


def make_optimizer(
    params: ModelParams, weights: list[torch.Tensor], fake: bool = False
) -> torch.optim.Optimizer:
    """The spec's optimizer; ``fake``: on fake tensors, bitsandbytes' and torchao's by
    their rules."""
    name, impl = params.optimizer, params.optimizer_impl
    options: dict[str, Any] = {}
    if impl == "for-loop":
        options["foreach"] = False
    elif impl == "foreach":
        options["foreach"] = True
    elif impl == "fused":
        options["fused"] = True
    if name in ("sgd", "sgd-momentum"):
        momentum = 0.9 if name == "sgd-momentum" else 0.0
        return torch.optim.SGD(weights, lr=1e-4, momentum=momentum, **options)
    if name == "adam":
        return torch.optim.Adam(weights, lr=1e-4, **options)
    if name == "adafactor":
        kind = rules.FakeAdafactor if fake else torch.optim.Adafactor
        return kind(weights, lr=1e-2, **options)
    if name == "transformers-adafactor":
        return finetune.adafactor(weights)
    if name in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        if fake:
            return rules.BnbAdamWRule(weights, 32 if name == "paged-adamw" else 8, "paged" in name)
        return finetune.bitsandbytes_optimizer(name, weights)
    if name in finetune.TORCHAO_CLASSES:
        if fake:
            finetune.check_torchao()  # refused here too: the predictor answers for the worker
            return rules.TorchaoAdamWRule(weights, name)
        return finetune.torchao_optimizer(name, weights)
    return torch.optim.AdamW(weights, lr=1e-4, **options)


def make_inputs(
    kind: str, config: Any, params: ModelParams, device: torch.device
) -> dict[str, torch.Tensor]:
    """One step's batch: token ids (with labels when training) or images and classes."""
    batch = params.batch_size
    train = params.task == "train"
    if kind == "image-classification":
        size = int(params.image_size or getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE)
        channels = int(getattr(config, "num_channels", 3))
        dtype = WEIGHT_DTYPES.get(params.precision, torch.float32)
        pixels = torch.zeros(batch, channels, size, size, dtype=dtype, device=device)
        inputs = {"pixel_values": pixels}
        if train:
            inputs["labels"] = torch.zeros(batch, dtype=torch.long, device=device)
        return inputs
    seq = params.seq_len_or_default
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    # Token ids spread over the vocabulary; their values change no byte counts.
    ids = (torch.arange(batch * seq, device=device) % vocab).reshape(batch, seq)
    inputs = {"input_ids": ids}
    if kind == "seq2seq-lm" and params.task == "inference":
        inputs["decoder_input_ids"] = ids.clone()
    if train:
        target = params.target_len
        if kind == "seq2seq-lm" and target is not None:  # labels as long as the targets
            inputs["labels"] = (torch.arange(batch * target, device=device) % vocab).reshape(
                batch, target
            )
        else:
            inputs["labels"] = ids.clone()
    return inputs
