"""The fine-tuning knobs of a model spec, read once (``FineTune.of``), and what they do to
the model the worker builds: the step's own dropout, LoRA through peft, the optimizers
that are not PyTorch's (transformers' Adafactor, bitsandbytes' 8-bit and paged AdamW,
torchao's low-bit AdamW).

The API checks the knobs and writes Trainer's vocabulary out as them
(app/catalog/finetune.py); here they are only read. What cannot run on fake tensors
(bitsandbytes' kernels, torchao's compiled step) is predicted by rules for its own tensors
(workers/models/rules.py).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from vramlab.runspec import ModelParams

# Config attributes that hold a dropout probability, by how transformers names them.
_DROPOUT_NAME = re.compile(r"(dropout|pdrop|drop_rate|dropout_rate)$")


@dataclass(frozen=True)
class Lora:
    r: int
    alpha: float
    dropout: float
    target_modules: str | list[str]
    modules_to_save: list[str] | None = None
    bias: str = "none"

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Lora:
        return cls(
            r=int(value["r"]),
            alpha=float(value["alpha"]),
            dropout=float(value.get("dropout", 0.0)),
            target_modules=value.get("target_modules", "all-linear"),
            modules_to_save=value.get("modules_to_save"),
            bias=str(value.get("bias", "none")),
        )


@dataclass(frozen=True)
class Quantization:
    method: str  # "nf4" | "int8"
    double_quant: bool
    compute_dtype: str  # "bf16" | "fp16" | "fp32"

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Quantization:
        return cls(
            str(value["method"]), bool(value.get("double_quant")), str(value["compute_dtype"])
        )


@dataclass(frozen=True)
class FineTune:
    """The knobs, parsed once from a spec's params (checked by the API before)."""

    dropout: float | None = None
    target_len: int | None = None
    use_cache: bool | None = None
    logits_to_keep: int | None = None
    lora: Lora | None = None
    quantization: Quantization | None = None
    loss: str = "default"
    max_grad_norm: float | None = None
    config_json: Mapping[str, Any] | None = None
    # Trainer's step (``trainer`` given): its ``use_cache`` (TrainingArguments' default is
    # False: Trainer sets ``model.config.use_cache`` to it, so its forward keeps no KV cache).
    trainer_use_cache: bool | None = None

    @classmethod
    def of(cls, params: ModelParams) -> FineTune:
        lora, quant = params.peft, params.quantization
        return cls(
            dropout=params.dropout,
            target_len=params.target_len,
            use_cache=params.use_cache,
            logits_to_keep=params.logits_to_keep,
            lora=Lora.of(lora) if isinstance(lora, Mapping) else None,
            quantization=Quantization.of(quant) if isinstance(quant, Mapping) else None,
            loss=params.loss,
            max_grad_norm=params.max_grad_norm,
            config_json=params.config_json,
            trainer_use_cache=(
                None if params.trainer is None else bool(params.trainer.get("use_cache", False))
            ),
        )

    @property
    def trainer(self) -> bool:
        return self.trainer_use_cache is not None


def dropout_overrides(config: Any, p: float) -> dict[str, float]:
    """The config's dropout probabilities, all set to ``p`` (the ``dropout`` knob)."""
    return {
        key: p
        for key, value in vars(config).items()
        if _DROPOUT_NAME.search(key) and isinstance(value, float) and not isinstance(value, bool)
    }


def set_dropout(model: torch.nn.Module, p: float) -> None:
    """Every dropout module of the model at ``p`` (those a config value does not reach)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p


def apply_lora(model: torch.nn.Module, lora: Lora, fake: bool = False) -> torch.nn.Module:
    """The model with peft's LoRA adapters (the base frozen), as people call peft.
    ``fake``: the model is on fake tensors (the predictor), whose parameters PyTorch's
    ``Module.to`` cannot swap in place; there they are replaced instead."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft takes a float
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        modules_to_save=lora.modules_to_save,
        bias=lora.bias,  # type: ignore[arg-type]  # checked by the API
    )
    try:
        with _replacing_apply() if fake else contextlib.nullcontext():
            return get_peft_model(model, config)
    except ValueError as exc:
        from vramlab.catalog.errors import CatalogError

        raise CatalogError("params.peft", f"peft cannot adapt this model: {exc}") from None


@contextlib.contextmanager
def _replacing_apply() -> Iterator[None]:
    """``Module._apply`` that puts the converted parameters in place of the old ones (the
    same bytes as the real conversion; nothing holds the old ones yet)."""

    def apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if recurse:
            for child in self.children():
                child._apply(fn)
        for key, param in self._parameters.items():
            if param is not None:
                with torch.no_grad():
                    applied = fn(param)
                if applied is not param:
                    self._parameters[key] = torch.nn.Parameter(applied, param.requires_grad)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    with mock.patch.object(torch.nn.Module, "_apply", apply):
        yield


def trainable(model: torch.nn.Module) -> tuple[int, list[str]]:
    """The trainable parameters' count and names (a repeated block's index as ``*``)."""
    names: dict[str, None] = {}
    count = 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            count += p.numel()
            names[re.sub(r"\.\d+\.", ".*.", name)] = None
    return count, list(names)


def adafactor(weights: list[torch.Tensor]) -> torch.optim.Optimizer:
    """transformers' Adafactor as Trainer's ``optim="adafactor"`` builds it."""
    from transformers.optimization import Adafactor

    return Adafactor(weights, lr=5e-5, scale_parameter=False, relative_step=False)


def bitsandbytes_optimizer(name: str, weights: list[torch.Tensor]) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW: 8-bit, paged 8-bit or paged 32-bit (CUDA)."""
    import bitsandbytes as bnb

    if name == "adamw-8bit":
        return bnb.optim.AdamW8bit(weights, lr=1e-4)
    if name == "paged-adamw-8bit":
        return bnb.optim.PagedAdamW8bit(weights, lr=1e-4)
    return bnb.optim.PagedAdamW(weights, lr=1e-4)


# torchao releases whose optimizer state the rule follows (workers/models/rules.py), and
# the oldest torch each loads its builds on (torchao/__init__.py: 0.18 needs 2.11).
TORCHAO_MIN_TORCH = {(0, 18): (2, 11)}
TORCHAO_CLASSES = {
    "torchao-adamw-8bit": "AdamW8bit",
    "torchao-adamw-4bit": "AdamW4bit",
    "torchao-adamw-fp8": "AdamWFp8",
}


def torchao_problem() -> str | None:
    """Why torchao's optimizers cannot run beside this torch (None: they can). Read from
    the installed distribution's version, without importing torchao."""
    from importlib import metadata

    try:
        version = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return (
            "torchao is not installed beside this torch "
            f"({torch.__version__}): pip install torchao (0.18, for torch 2.11 or later)"
        )
    release = _major_minor(version)
    known = ", ".join(f"{a}.{b}" for a, b in TORCHAO_MIN_TORCH)
    if release not in TORCHAO_MIN_TORCH:
        return (
            f"torchao {version} is installed; its optimizers' state is known here for "
            f"torchao {known} only"
        )
    need = TORCHAO_MIN_TORCH[release]
    if _major_minor(torch.__version__) < need:
        return (
            f"torchao {version} is built for torch {need[0]}.{need[1]} or later; "
            f"this torch is {torch.__version__}"
        )
    return None


def _major_minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def check_torchao() -> None:
    """Refuse a torchao optimizer where torchao is missing or does not match torch."""
    problem = torchao_problem()
    if problem is not None:
        from vramlab.catalog.errors import CatalogError

        raise CatalogError("params.optimizer", problem)


def torchao_optimizer(name: str, weights: list[torch.Tensor]) -> torch.optim.Optimizer:
    """torchao's low-bit AdamW as its docs show it (state quantized per block; each
    parameter's update a torch.compile'd function, CPU or CUDA)."""
    check_torchao()
    import torchao.optim

    optimizer: torch.optim.Optimizer = getattr(torchao.optim, TORCHAO_CLASSES[name])(
        weights, lr=1e-4
    )
    return optimizer


@contextlib.contextmanager
def step_untallied(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """torchao's update is torch.compile'd, and torch.compile runs under no dispatch mode:
    under the category tally its step runs with the tally set aside (its compiled kernels'
    buffers are in the measured peak, not in the tally's categories)."""
    if optimizer is None or not type(optimizer).__module__.startswith("torchao."):
        yield
        return
    from torch.utils._python_dispatch import _disable_current_modes

    step = optimizer.step

    def untallied(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return step(*args, **kwargs)

    with mock.patch.object(optimizer, "step", untallied):
        yield


def state_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold a state tensor's bytes: a tensor subclass (torchao's
    quantized state: codes, scales, a quantization map) by its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for name in names for leaf in state_tensors(getattr(t, name))]


def is_paged(t: torch.Tensor) -> bool:
    """A tensor in CUDA managed memory (bitsandbytes' paged state): the caching
    allocator's counters do not see it."""
    return bool(getattr(t, "is_paged", False))


def quantized(
    model: torch.nn.Module,
    auto: Any,
    kwargs: Mapping[str, Any],
    quant: Quantization,
    device: torch.device,
    train: bool,
) -> torch.nn.Module:
    """The model reloaded through transformers' bitsandbytes integration, as people load a
    checkpoint (its random weights saved to a temporary folder first), then for training
    peft's ``prepare_model_for_kbit_training`` (checkpointing left to the spec's knob)."""
    import tempfile

    from transformers import BitsAndBytesConfig

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if quant.method == "nf4":
        config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=quant.double_quant,
            bnb_4bit_compute_dtype=dtypes[quant.compute_dtype],
        )
    else:
        config = BitsAndBytesConfig(load_in_8bit=True)
    with tempfile.TemporaryDirectory(prefix="vramlab-quant-") as folder:
        model.save_pretrained(folder)  # type: ignore[operator]
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        loaded = auto.from_pretrained(
            folder, quantization_config=config, device_map={"": device}, **kwargs
        )
    if train:
        from peft import prepare_model_for_kbit_training

        loaded = prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return loaded


def apply_liger(model: torch.nn.Module) -> None:
    """Liger's fused linear cross-entropy patched into this model (its other kernels off)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(
        model=model, rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True
    )
