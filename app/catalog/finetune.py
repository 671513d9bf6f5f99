"""Fine-tuning knobs of a model spec, as people write them: the step's own dropout, short
seq2seq targets, the inference cache and kept logits, their own config.json, LoRA through
peft, a quantized base, 8-bit and paged optimizers, a fused loss, and Trainer's arguments.

Torch-free: the names and bounds are declared here once (the model entry lists them), the
cross-field rules run in the API, and ``normalize`` turns Trainer's vocabulary and the
``qlora`` shorthand into the knobs the worker and the predictor read
(workers/models/finetune.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from app.catalog import distributed
from vramlab.catalog.errors import CatalogError

Params = Mapping[str, Any]

# The knobs' names and bounds are ModelParams' fields (vramlab.runspec); here, their rules.
# Optimizers from bitsandbytes: CUDA only (their kernels have no CPU build here).
CUDA_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")
PAGED_OPTIMIZERS = ("paged-adamw-8bit", "paged-adamw")
# torchao's low-bit AdamW (torchao.optim: 8-bit, 4-bit and FP8 state; CPU and CUDA). The
# worker and the predictor check that torchao is installed and matches their torch.
TORCHAO_OPTIMIZERS = ("torchao-adamw-8bit", "torchao-adamw-4bit", "torchao-adamw-fp8")
# Optimizers from transformers (Trainer's `adafactor`: no relative step, no scaling).
TRANSFORMERS_OPTIMIZERS = ("transformers-adafactor",)
QUANT_METHODS = ("nf4", "int8")
COMPUTE_DTYPES = ("bf16", "fp16", "fp32")
LORA_DEFAULT = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}

# A whole config.json, inline: bounded before anything reads it.
MAX_CONFIG_BYTES = 64 * 1024
MAX_CONFIG_DEPTH = 4
MAX_CONFIG_KEYS = 512
# Written by transformers into every config.json and harmless to a config built here.
TOLERATED_KEYS = (
    "architectures",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_name_or_path",
    "_attn_implementation_autoset",
)
# Keys that would load code (a repository's modules) or weights-dependent machinery.
REFUSED_KEYS = {
    "auto_map": "it names code to load from a repository; only transformers' own "
    "architectures are built here",
    "trust_remote_code": "no remote code is run here",
    "custom_pipelines": "it names code to load from a repository",
    "quantization_config": "a quantized base is the spec's `quantization` param",
}

# Trainer's optimizer names and the spec's optimizer values.
TRAINER_OPTIMS = {
    "adamw_torch": ("adamw", "default"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_bnb_8bit": ("adamw-8bit", "default"),
    "adamw_8bit": ("adamw-8bit", "default"),
    "paged_adamw_8bit": ("paged-adamw-8bit", "default"),
    "paged_adamw_32bit": ("paged-adamw", "default"),
    "adafactor": ("transformers-adafactor", "default"),
    "sgd": ("sgd", "default"),
}
TRAINER_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "gradient_checkpointing",
    "optim",
    "max_grad_norm",
)

# -- config.json ---------------------------------------------------------------------------


def check_document(value: Any, field: str) -> dict[str, Any]:
    """A config.json mapping, bounded (bytes, depth, keys) and free of code-loading keys."""
    if not isinstance(value, dict):
        raise CatalogError(field, "must be a config.json object")
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (ValueError, TypeError):
        raise CatalogError(field, "must be JSON: finite numbers, strings, lists, objects") from None
    if size > MAX_CONFIG_BYTES:
        raise CatalogError(field, f"is {size} bytes as JSON; at most {MAX_CONFIG_BYTES}")
    count = _count_keys(value, field, 1)
    if count > MAX_CONFIG_KEYS:
        raise CatalogError(field, f"has {count} keys; at most {MAX_CONFIG_KEYS}")
    for key, why in REFUSED_KEYS.items():
        if key in value:
            raise CatalogError(f"{field}.{key}", f"is refused: {why}")
    model_type = value.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CatalogError(f"{field}.model_type", "is required: the config's model_type")
    return dict(value)  # tolerated keys stay for the record; the build skips them


def _count_keys(value: Any, field: str, depth: int) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise CatalogError(field, "must be finite")
    if isinstance(value, dict):
        if depth > MAX_CONFIG_DEPTH:
            raise CatalogError(field, f"nests deeper than {MAX_CONFIG_DEPTH} levels")
        total = len(value)
        for key, item in value.items():
            if key in REFUSED_KEYS and depth > 1:
                raise CatalogError(f"{field}.{key}", f"is refused: {REFUSED_KEYS[key]}")
            total += _count_keys(item, f"{field}.{key}", depth + 1)
        return total
    if isinstance(value, list):
        if depth > MAX_CONFIG_DEPTH:
            raise CatalogError(field, f"nests deeper than {MAX_CONFIG_DEPTH} levels")
        return sum(_count_keys(item, f"{field}[{i}]", depth + 1) for i, item in enumerate(value))
    return 0


# -- normalize: Trainer's vocabulary and shorthands into knobs -----------------------------


def normalize(params: dict[str, Any]) -> dict[str, Any]:
    """The spec's knobs with ``trainer`` applied (its fields win) and ``quantization``
    written out; the ``trainer`` mapping stays as given, for the record."""
    out = dict(params)
    trainer = out.get("trainer")
    if trainer is not None:
        out.update(trainer_knobs(trainer, out))
    quant = out.get("quantization")
    if quant == "qlora":
        out["quantization"] = {"method": "nf4", "double_quant": True, "compute_dtype": "bf16"}
        if out.get("peft") is None:
            out["peft"] = dict(LORA_DEFAULT)
    if out.get("quantization") is not None:
        out["quantization"] = check_quantization(out["quantization"])
    if out.get("peft") is not None:
        out["peft"] = check_lora(out["peft"])
    if out.get("distributed") is not None:
        out["distributed"] = distributed.normalize(out["distributed"])
    return out


def trainer_knobs(trainer: Mapping[str, Any], params: Params) -> dict[str, Any]:
    """TrainingArguments fields as the spec's knobs (step 2 of Trainer's loop is one
    optimizer step: per-device batch x accumulation steps samples)."""
    unknown = sorted(set(trainer) - set(TRAINER_FIELDS))
    if unknown:
        raise CatalogError(
            f"params.trainer.{unknown[0]}",
            f"is not a TrainingArguments field read here; known: {', '.join(TRAINER_FIELDS)}",
        )
    batch = _int(trainer, "per_device_train_batch_size", 8)
    accumulation = _int(trainer, "gradient_accumulation_steps", 1)
    knobs: dict[str, Any] = {
        "task": "train",
        "batch_size": batch * accumulation,
        "micro_batches": accumulation,
    }
    bf16, fp16 = _bool(trainer, "bf16"), _bool(trainer, "fp16")
    if bf16 and fp16:
        raise CatalogError("params.trainer.fp16", "bf16 and fp16 cannot both be on")
    if bf16 or fp16:
        weights = params.get("precision", "fp32")
        if weights not in ("fp32", "bf16-autocast", "fp16-autocast"):
            raise CatalogError(
                "params.trainer",
                f"Trainer's bf16/fp16 is autocast over fp32 weights, not {weights}",
            )
        knobs["precision"] = "bf16-autocast" if bf16 else "fp16-autocast"
    if "gradient_checkpointing" in trainer:
        knobs["checkpointing"] = _bool(trainer, "gradient_checkpointing")
    optim = trainer.get("optim", "adamw_torch_fused")
    if optim not in TRAINER_OPTIMS:
        raise CatalogError(
            "params.trainer.optim", f"must be one of {', '.join(TRAINER_OPTIMS)} (got {optim!r})"
        )
    knobs["optimizer"], knobs["optimizer_impl"] = TRAINER_OPTIMS[optim]
    norm = trainer.get("max_grad_norm", 1.0)
    if isinstance(norm, bool) or not isinstance(norm, int | float) or norm < 0:
        raise CatalogError("params.trainer.max_grad_norm", "must be a number >= 0")
    knobs["max_grad_norm"] = float(norm) if norm > 0 else None
    return knobs


def _int(trainer: Mapping[str, Any], key: str, default: int) -> int:
    value = trainer.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
        raise CatalogError(f"params.trainer.{key}", "must be an integer from 1 to 65536")
    return value


def _bool(trainer: Mapping[str, Any], key: str) -> bool:
    value = trainer.get(key, False)
    if not isinstance(value, bool):
        raise CatalogError(f"params.trainer.{key}", "must be true or false")
    return value


def check_lora(value: Any) -> dict[str, Any]:
    field = "params.peft"
    if not isinstance(value, dict):
        raise CatalogError(field, "must be an object: r, alpha, dropout, target_modules")
    allowed = ("r", "alpha", "dropout", "target_modules", "modules_to_save", "bias")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise CatalogError(f"{field}.{unknown[0]}", f"is not a LoRA field; known: {allowed}")
    out = {**LORA_DEFAULT, **value}
    r = out["r"]
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 4096:
        raise CatalogError(f"{field}.r", "must be an integer from 1 to 4096")
    alpha = out["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise CatalogError(f"{field}.alpha", "must be a number > 0")
    dropout = out["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise CatalogError(f"{field}.dropout", "must be a number from 0 to below 1")
    targets = out["target_modules"]
    if targets != "all-linear" and not _names(targets):
        raise CatalogError(
            f"{field}.target_modules", 'must be "all-linear" or a list of module names'
        )
    if out.get("modules_to_save") is not None and not _names(out["modules_to_save"]):
        raise CatalogError(f"{field}.modules_to_save", "must be a list of module names")
    if out.get("bias", "none") not in ("none", "all", "lora_only"):
        raise CatalogError(f"{field}.bias", "must be none, all or lora_only")
    return out


def _names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= 64
        and all(isinstance(v, str) and 0 < len(v) <= 100 for v in value)
    )


def check_quantization(value: Any) -> dict[str, Any]:
    field = "params.quantization"
    if not isinstance(value, dict):
        raise CatalogError(field, 'must be an object {"method": ...} or "qlora"')
    unknown = sorted(set(value) - {"method", "double_quant", "compute_dtype"})
    if unknown:
        raise CatalogError(f"{field}.{unknown[0]}", "known: method, double_quant, compute_dtype")
    method = value.get("method")
    if method not in QUANT_METHODS:
        raise CatalogError(f"{field}.method", f"must be one of {', '.join(QUANT_METHODS)}")
    double = value.get("double_quant", False)
    if not isinstance(double, bool):
        raise CatalogError(f"{field}.double_quant", "must be true or false")
    compute = value.get("compute_dtype", "bf16")
    if compute not in COMPUTE_DTYPES:
        raise CatalogError(f"{field}.compute_dtype", f"must be one of {', '.join(COMPUTE_DTYPES)}")
    if method == "int8" and double:
        raise CatalogError(f"{field}.double_quant", "is for nf4 (4-bit) only")
    return {"method": method, "double_quant": double, "compute_dtype": compute}


# -- cross-field rules ---------------------------------------------------------------------


def check_finetune(params: Params, kind: str, device: str | None) -> None:
    """Rules between the fine-tuning knobs, the task, the model's kind and the device."""
    task = params["task"]
    if params.get("target_len") is not None:
        if kind != "seq2seq-lm":
            raise CatalogError("params.target_len", "target_len is for seq2seq models")
        if task != "train":
            raise CatalogError("params.target_len", "target_len is for training")
    for name in ("use_cache", "logits_to_keep"):
        if params.get(name) is not None and task == "train":
            raise CatalogError(f"params.{name}", f"{name} is for inference and generate")
    if params.get("logits_to_keep") is not None and kind != "causal-lm":
        raise CatalogError("params.logits_to_keep", "logits_to_keep is for causal LMs")
    if params.get("use_cache") is False and task == "generate" and kind != "causal-lm":
        raise CatalogError("params.use_cache", "generation without a cache is for causal LMs")
    if params.get("dropout") is not None and task != "train":
        raise CatalogError("params.dropout", "dropout only acts while training")
    if params.get("peft") is not None:
        if task != "train":
            raise CatalogError("params.peft", "LoRA adapters are trained: use task train")
        if kind == "image-classification" and params["peft"]["target_modules"] == "all-linear":
            pass  # peft finds the linear layers of a ViT as of any model
    cuda = device is not None and not device.startswith("cpu")
    optimizer = params.get("optimizer")
    if optimizer in CUDA_OPTIMIZERS and not cuda:
        raise CatalogError(
            "params.optimizer", f"{optimizer} is bitsandbytes' and runs on CUDA devices only"
        )
    quant = params.get("quantization")
    if quant is not None:
        if not cuda:
            raise CatalogError("params.quantization", "bitsandbytes' quantized base is CUDA only")
        if task == "train" and params.get("peft") is None:
            raise CatalogError(
                "params.quantization",
                "a quantized base cannot be trained itself: add peft (LoRA) or use inference",
            )
        if params.get("precision") not in ("fp32", "bf16", "fp16"):
            raise CatalogError("params.precision", "a quantized base takes plain precision")
    if params.get("loss") == "liger":
        if not cuda:
            raise CatalogError("params.loss", "Liger's kernels run on CUDA devices only")
        if task != "train" or kind != "causal-lm":
            raise CatalogError("params.loss", "Liger's fused loss is for training causal LMs")
    if params.get("max_grad_norm") is not None and task != "train":
        raise CatalogError("params.max_grad_norm", "clipping is for training")
    distributed.check(params, kind, device)
