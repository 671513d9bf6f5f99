"""Model experiments: a real model's training step, forward pass or generation.

The model comes from transformers (a preset's config, or any model_type the Auto classes
build, with config overrides; random weights, never downloaded). Its memory is predicted
by the model predictor (workers/models/predict.py, run beside the API in a child process
because the API never imports torch) and measured by the worker (workers/models/).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.catalog import finetune
from app.catalog.families.common import Params, Shape
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan
from vramlab.catalog.model_zoo import UnknownModel, resolve_spec
from vramlab.runspec import (
    DEFAULT_NEW_TOKENS,
    MODEL_OP,
    model_default,
    model_param_fields,
)

# Which implementations each optimizer has in PyTorch.
_IMPLS = {
    "sgd": ("default", "for-loop", "foreach", "fused"),
    "sgd-momentum": ("default", "for-loop", "foreach", "fused"),
    "adam": ("default", "for-loop", "foreach", "fused"),
    "adamw": ("default", "for-loop", "foreach", "fused"),
    "adafactor": ("default", "for-loop", "foreach"),
    "transformers-adafactor": ("default",),
    **{name: ("default",) for name in finetune.CUDA_OPTIMIZERS},
    **{name: ("default",) for name in finetune.TORCHAO_OPTIMIZERS},
}
# Config names that bound the sequence length, by what transformers calls them.
_POSITION_KEYS = ("n_positions", "max_position_embeddings")
_POSITIONS_DEFAULT = {"gpt2": 1024, "bert": 512}

MODEL_CAVEAT = (
    "a model's step is predicted as a whole (prediction.peak_allocated and categories), "
    "not as an op's tensors: allocated_before, delta and outputs are not predicted"
)


def check_model(params: Params, device: str | None = None) -> None:
    """Cross-field rules of a model spec; raise CatalogError naming the field at fault."""
    config_json = params.get("config_json")
    try:
        resolved = resolve_spec(params["model"], params["head"], config_json)
    except UnknownModel as exc:
        field = "params.model" if config_json is None else "params.config_json"
        raise CatalogError(field, str(exc)) from None
    task, kind = params["task"], resolved.kind
    image = kind == "image-classification"
    if task == "generate" and kind not in ("causal-lm", "seq2seq-lm"):
        raise CatalogError(
            "params.task", f"a {kind} model does not generate; use train or inference"
        )
    if image and params["seq_len"] is not None:
        raise CatalogError("params.seq_len", "an image model takes image_size, not seq_len")
    if not image and params["image_size"] is not None:
        raise CatalogError("params.image_size", "a text model takes seq_len, not image_size")
    if params["precision"] == "fp16-autocast" and task != "train":
        pass  # autocast without a scaler is fine for inference
    if params["checkpointing"] and task != "train":
        raise CatalogError("params.checkpointing", "activation checkpointing only helps training")
    if params["micro_batches"] > 1:
        if task != "train":
            raise CatalogError("params.micro_batches", "micro-batches are for training")
        if params["batch_size"] % params["micro_batches"]:
            raise CatalogError(
                "params.micro_batches",
                f"batch_size {params['batch_size']} must divide by micro_batches "
                f"{params['micro_batches']}",
            )
    if params["new_tokens"] is not None and task != "generate":
        raise CatalogError("params.new_tokens", "new_tokens is for task 'generate'")
    if params["steps"] < 2 and task == "train":
        raise CatalogError(
            "params.steps", "a training run needs 2 steps: step 2 is where optimizer state exists"
        )
    impl, optimizer = params["optimizer_impl"], params["optimizer"]
    if impl not in _IMPLS[optimizer]:
        raise CatalogError(
            "params.optimizer_impl",
            f"{optimizer} has no {impl} implementation; it has {', '.join(_IMPLS[optimizer])}",
        )
    finetune.check_finetune(params, kind, device)
    config = {**resolved.config, **(params["config"] or {})}
    limit = next((config[k] for k in _POSITION_KEYS if k in config), None)
    limit = limit or _POSITIONS_DEFAULT.get(resolved.model_type)
    seq_len = params["seq_len"] or 0
    if task == "generate":
        seq_len += params["new_tokens"] or DEFAULT_NEW_TOKENS
    if isinstance(limit, int) and seq_len > limit:
        raise CatalogError(
            "params.seq_len",
            f"{resolved.name} has {limit} positions; seq_len (plus new_tokens when generating) "
            f"is {seq_len}",
        )


def _plan(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    if shape:
        raise CatalogError(
            "shape", "a model experiment takes shape []: batch_size and seq_len are params"
        )
    check_model(params, device)
    return TensorPlan(inputs=(), outputs=(), caveats=(MODEL_CAVEAT,))


def _param(f: dataclasses.Field[Any]) -> Param:
    """A catalog parameter from a ``ModelParams`` field: its default and what it says."""
    meta = f.metadata
    return Param(
        f.name,
        meta["kind"],
        meta["description"],
        default=model_default(f.name),
        minimum=meta["minimum"],
        maximum=meta["maximum"],
        choices=meta["choices"],
        required=meta["required"],
    )


ENTRIES = (
    OpEntry(
        MODEL_OP,
        "a real model's training step, forward pass or generation (transformers, random "
        "weights): peaks per phase and step, and what held memory at the peak by category",
        _plan,
        # Declared once, as ModelParams' fields (vramlab.runspec): a new knob is a field.
        params=tuple(_param(f) for f in model_param_fields()),
        dtypes=("float32",),
        devices=("cpu", "cuda"),
        tags=("model",),
        normalize=finetune.normalize,
    ),
)
