"""A model spec's ``distributed`` param: one training step on several GPUs of one host,
DDP or FSDP2, as one experiment (docs/models.md, "Several GPUs of one host").

Torch-free: the shape of the mapping is checked and written out with its defaults here
(``normalize``), and its rules against the other knobs run in the API (``check``). The
worker reads it as ``vramlab.runspec.Distributed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramlab.catalog.errors import CatalogError
from vramlab.runspec import (
    DISTRIBUTED_MAX_GPUS,
    DISTRIBUTED_MIN_GPUS,
    DISTRIBUTED_SHARDINGS,
    DISTRIBUTED_STRATEGIES,
)

FIELD = "params.distributed"
KEYS = ("strategy", "gpus", "sharding", "offload_optimizer", "mixed_precision")
FSDP_ONLY = ("sharding", "offload_optimizer", "mixed_precision")
# What a sharded (DTensor) parameter's optimizer is tested with here.
FSDP_OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")


def normalize(value: Any) -> dict[str, Any]:
    """The mapping checked, with its defaults written out (fsdp: full sharding)."""
    if not isinstance(value, dict):
        raise CatalogError(FIELD, 'must be an object: {"strategy": "ddp" | "fsdp", "gpus": N}')
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise CatalogError(f"{FIELD}.{unknown[0]}", f"is not a distributed field; known: {KEYS}")
    strategy = value.get("strategy")
    if strategy not in DISTRIBUTED_STRATEGIES:
        raise CatalogError(
            f"{FIELD}.strategy", f"must be one of {', '.join(DISTRIBUTED_STRATEGIES)}"
        )
    gpus = value.get("gpus")
    if (
        isinstance(gpus, bool)
        or not isinstance(gpus, int)
        or not DISTRIBUTED_MIN_GPUS <= gpus <= DISTRIBUTED_MAX_GPUS
    ):
        raise CatalogError(
            f"{FIELD}.gpus",
            f"must be an integer from {DISTRIBUTED_MIN_GPUS} to {DISTRIBUTED_MAX_GPUS} "
            "(the GPUs of one host; one GPU is a plain spec)",
        )
    if strategy == "ddp":
        for key in FSDP_ONLY:
            if value.get(key) not in (None, False):
                hint = "; for bf16 use precision bf16-autocast" if key == "mixed_precision" else ""
                raise CatalogError(
                    f"{FIELD}.{key}", f"is for fsdp only: DDP keeps whole replicas{hint}"
                )
        return {"strategy": "ddp", "gpus": gpus}
    sharding = value.get("sharding", "full")
    if sharding not in DISTRIBUTED_SHARDINGS:
        raise CatalogError(
            f"{FIELD}.sharding", f"must be one of {', '.join(DISTRIBUTED_SHARDINGS)}"
        )
    if sharding == "hybrid" and (gpus < 4 or gpus % 2):
        raise CatalogError(
            f"{FIELD}.sharding",
            f"hybrid sharding (HSDP) replicates over 2 groups that each shard: it needs an "
            f"even number of GPUs, at least 4 (got {gpus})",
        )
    offload = value.get("offload_optimizer", False)
    if not isinstance(offload, bool):
        raise CatalogError(f"{FIELD}.offload_optimizer", "must be true or false")
    mixed = value.get("mixed_precision")
    if mixed not in (None, "bf16"):
        raise CatalogError(f"{FIELD}.mixed_precision", 'must be "bf16" or left out')
    return {
        "strategy": "fsdp",
        "gpus": gpus,
        "sharding": sharding,
        "offload_optimizer": offload,
        "mixed_precision": mixed,
    }


def check(params: Mapping[str, Any], kind: str, device: str | None) -> None:
    """Rules between ``distributed`` and the other knobs (after ``normalize``)."""
    dist = params.get("distributed")
    if dist is None:
        return
    if params["task"] != "train":
        raise CatalogError(FIELD, "is for training: DDP and FSDP split a training step")
    if device is not None and device.startswith("cuda") and device not in ("cuda", "cuda:0"):
        raise CatalogError(
            "device", "a distributed run takes cuda:0 to cuda:N-1: name cuda (or cuda:0)"
        )
    if dist.get("offload_optimizer") and device is not None and device.startswith("cpu"):
        raise CatalogError(
            f"{FIELD}.offload_optimizer",
            "moves the shards and the optimizer's state from the GPUs to the host: it needs "
            "a CUDA device (on the CPU there is nothing to offload from)",
        )
    refused = {
        "quantization": "a bitsandbytes-quantized base is not sharded or replicated here",
        "peft": "LoRA across GPUs is not measured yet",
    }
    for key, why in refused.items():
        if params.get(key) is not None:
            raise CatalogError(f"params.{key}", f"not with distributed: {why}")
    if params.get("loss") == "liger":
        raise CatalogError("params.loss", "not with distributed: Liger's loss is not tested so")
    optimizer = params.get("optimizer")
    if dist["strategy"] == "fsdp":
        if optimizer not in FSDP_OPTIMIZERS:
            raise CatalogError(
                "params.optimizer",
                f"FSDP shards parameters as DTensors; its optimizers here: "
                f"{', '.join(FSDP_OPTIMIZERS)}",
            )
        if params.get("precision") == "fp16-autocast":
            raise CatalogError(
                "params.precision",
                "fp16 autocast needs a sharded GradScaler under FSDP; use bf16-autocast or "
                'distributed.mixed_precision "bf16"',
            )
        if dist.get("mixed_precision") and params.get("precision") != "fp32":
            raise CatalogError(
                "params.precision",
                "FSDP's bf16 mixed precision casts fp32 weights: leave precision fp32",
            )
    elif optimizer in ("paged-adamw-8bit", "paged-adamw"):
        raise CatalogError("params.optimizer", "paged optimizers are not measured across GPUs")
    elif str(optimizer).startswith("torchao-"):
        raise CatalogError("params.optimizer", "torchao's optimizers are not measured across GPUs")
