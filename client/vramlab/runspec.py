"""The run spec: what a worker runs, typed, with its defaults and limits declared once.

The queue builds a ``RunSpec`` once, where it hands an experiment to a worker
(``POST /v1/worker/claim``), and it is the only thing that crosses to the worker: the
worker reads its attributes, never keys. A model experiment's parameters are their own
typed part, ``ModelParams``; the catalog describes and checks them from the fields
declared here (each field's ``metadata``: kind, description, bounds, choices), so a new
knob is one field below. Defaults and limits (``DEFAULT_*``, ``MAX_*``) are read from here
by the API's spec schema, the catalog, the model predictor, the fit search and the worker.

On the wire (the claim's ``spec``) a run spec is the same JSON as before it was typed:
``params`` is the op's parameters flat, a model's among them, so a worker of the release
before reads it as it did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vramlab import wire
from vramlab.contract import Prediction
from vramlab.names import Isolation
from vramlab.wire import Json

# What a spec gets when it leaves a field out, and the bounds the API holds it to.
DEFAULT_DTYPE = "float32"
DEFAULT_WARMUP = 1
MAX_WARMUP = 100
DEFAULT_REPEAT = 3
DEFAULT_TIMEOUT_S = 120.0
TraceMode = Literal["none", "events", "stacks"]
TRACE_MODES: tuple[TraceMode, ...] = ("none", "events", "stacks")
DEFAULT_TRACE: TraceMode = "events"
DEFAULT_ISOLATION = Isolation.CLEAN
MAX_DIMS = 8
MAX_DIM_SIZE = 2**31 - 1

# The model op: its choices, and the defaults its step takes where a param is left out.
MODEL_OP = "model"
Task = Literal["train", "inference", "generate"]
TASKS: tuple[Task, ...] = ("train", "inference", "generate")
Head = Literal["causal-lm", "masked-lm", "seq2seq-lm", "image-classification"]
HEADS: tuple[Head, ...] = ("causal-lm", "masked-lm", "seq2seq-lm", "image-classification")
Precision = Literal["fp32", "bf16", "fp16", "bf16-autocast", "fp16-autocast"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "fp16", "bf16-autocast", "fp16-autocast")
Optimizer = Literal[
    "sgd",
    "sgd-momentum",
    "adam",
    "adamw",
    "adafactor",
    "transformers-adafactor",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw",
    "torchao-adamw-8bit",
    "torchao-adamw-4bit",
    "torchao-adamw-fp8",
]
OPTIMIZERS: tuple[Optimizer, ...] = (
    "sgd",
    "sgd-momentum",
    "adam",
    "adamw",
    "adafactor",
    # transformers' Adafactor as Trainer's optim="adafactor" builds it
    "transformers-adafactor",
    # bitsandbytes' (CUDA only)
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw",
    # torchao's low-bit AdamW (torchao.optim; CPU and CUDA, where torchao matches torch)
    "torchao-adamw-8bit",
    "torchao-adamw-4bit",
    "torchao-adamw-fp8",
)
Loss = Literal["default", "liger"]
LOSSES: tuple[Loss, ...] = ("default", "liger")
OptimizerImpl = Literal["default", "for-loop", "foreach", "fused"]
OPTIMIZER_IMPLS: tuple[OptimizerImpl, ...] = ("default", "for-loop", "foreach", "fused")
Attention = Literal["sdpa", "eager"]
ATTENTIONS: tuple[Attention, ...] = ("sdpa", "eager")
# Several GPUs of one host (``distributed``): DDP or FSDP2, N ranks in one experiment.
DistributedStrategy = Literal["ddp", "fsdp"]
DISTRIBUTED_STRATEGIES: tuple[DistributedStrategy, ...] = ("ddp", "fsdp")
Sharding = Literal["full", "hybrid", "grad-op"]
DISTRIBUTED_SHARDINGS: tuple[Sharding, ...] = ("full", "hybrid", "grad-op")
DISTRIBUTED_MIN_GPUS = 2
DISTRIBUTED_MAX_GPUS = 8
DEFAULT_SEQ_LEN = 128  # a text model's tokens per sample when seq_len is left out
DEFAULT_NEW_TOKENS = 16  # tokens a generation decodes when new_tokens is left out
DEFAULT_IMAGE_SIZE = 224  # an image model's side when neither the spec nor its config says

ParamKind = Literal[
    "int", "float", "bool", "shape", "dtype", "device", "choice", "text", "mapping", "document"
]


def knob(
    kind: ParamKind,
    description: str,
    default: Any = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    required: bool = False,
) -> Any:
    """A ``ModelParams`` field: its default, and what the catalog says of it."""
    meta = {
        "kind": kind,
        "description": description,
        "minimum": minimum,
        "maximum": maximum,
        "choices": choices,
        "required": required,
    }
    if required:
        return field(metadata=meta)
    if isinstance(default, dict | list):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """A model spec's ``distributed``, as the API checked it (app/catalog/distributed.py)."""

    strategy: DistributedStrategy
    gpus: int
    sharding: Sharding = "full"
    offload_optimizer: bool = False
    mixed_precision: Literal["bf16"] | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Distributed:
        out: Distributed = wire.load(cls, {k: v for k, v in value.items() if v is not None})
        return out

    def devices(self, device: str) -> tuple[str, ...]:
        """The ranks' devices: cuda:0 to cuda:N-1 on CUDA; the CPU for every rank."""
        if device.startswith("cuda"):
            return tuple(f"cuda:{r}" for r in range(self.gpus))
        return ("cpu",)


@dataclass(frozen=True, kw_only=True)
class ModelParams:
    """A model experiment's parameters (op ``model``), as the catalog checked them.

    The fields' order is the catalog's (``GET /v1/catalog``); a field left ``None`` takes
    the default its property says (``seq_len_or_default``...)."""

    model: str | None = knob(
        "text",
        "a preset (gpt2, llama-8b, ...) or a transformers model_type (required unless "
        "config_json is given)",
    )
    # The one open mapping of a run spec: config names are transformers', not ours.
    config: dict[str, Json] | None = knob("mapping", 'config overrides, e.g. {"n_layer": 6}')
    head: Head | None = knob(
        "choice", "which Auto class builds a model_type (default: its first)", choices=HEADS
    )
    task: Task = knob(
        "choice",
        "train (two steps, step 2 reported), inference or generate",
        "train",
        choices=TASKS,
    )
    batch_size: int = knob("int", "samples per step", 1, minimum=1, maximum=65536)
    seq_len: int | None = knob(
        "int",
        f"tokens per sample (text models; default {DEFAULT_SEQ_LEN})",
        minimum=1,
        maximum=1048576,
    )
    image_size: int | None = knob(
        "int", "pixels per side (image models; default the config's)", minimum=8, maximum=8192
    )
    precision: Precision = knob(
        "choice", "weights dtype, or fp32 weights under autocast", "fp32", choices=PRECISIONS
    )
    optimizer: Optimizer = knob(
        "choice", "the optimizer of a training step", "adamw", choices=OPTIMIZERS
    )
    optimizer_impl: OptimizerImpl = knob(
        "choice", "PyTorch's implementation of the optimizer", "default", choices=OPTIMIZER_IMPLS
    )
    checkpointing: bool = knob("bool", "activation checkpointing (gradient checkpointing)", False)
    micro_batches: int = knob(
        "int", "gradient accumulation: micro-batches per step", 1, minimum=1, maximum=1024
    )
    new_tokens: int | None = knob(
        "int",
        f"tokens decoded after the prefill (generate; default {DEFAULT_NEW_TOKENS})",
        minimum=1,
        maximum=8192,
    )
    attention: Attention = knob("choice", "attention implementation", "sdpa", choices=ATTENTIONS)
    steps: int = knob("int", "steps run; the last is reported", 2, minimum=1, maximum=10)
    capacity_bytes: int | None = knob(
        "int", "emulate a smaller card: the memory this run may use", minimum=1
    )
    # Fine-tuning knobs (docs/models.md; checked in app/catalog/finetune.py, read by
    # workers/models/finetune.py).
    dropout: float | None = knob(
        "float",
        "dropout probability of every dropout in the model while training (default: the "
        "config's own)",
        minimum=0.0,
        maximum=1.0,
    )
    target_len: int | None = knob(
        "int",
        "label tokens per sample of a seq2seq training step (default: seq_len)",
        minimum=1,
        maximum=1048576,
    )
    use_cache: bool | None = knob(
        "bool", "keep the KV cache (inference and generate; default: the config's use_cache)"
    )
    logits_to_keep: int | None = knob(
        "int",
        "last positions whose logits the forward makes (inference and generate; 0: all; "
        "default: all for inference, 1 for generate's prefill)",
        minimum=0,
        maximum=1048576,
    )
    config_json: dict[str, Json] | None = knob(
        "document",
        "a whole config.json as transformers writes it (model_type inside; `model` may then "
        "be left out)",
    )
    peft: dict[str, Json] | None = knob(
        "mapping",
        'LoRA through peft: {"r", "alpha", "dropout", "target_modules", "modules_to_save"}; '
        "the base is frozen",
    )
    quantization: dict[str, Json] | str | None = knob(
        "mapping",
        'a quantized base through bitsandbytes (CUDA): {"method": "nf4" | "int8", '
        '"double_quant", "compute_dtype"}, or "qlora" (nf4, double quantisation, LoRA)',
        choices=("qlora",),
    )
    loss: Loss = knob(
        "choice",
        "the loss: the model's own, or Liger's fused linear cross-entropy (CUDA)",
        "default",
        choices=LOSSES,
    )
    max_grad_norm: float | None = knob(
        "float",
        "clip the gradients' norm before the optimizer's step (Trainer's max_grad_norm)",
        minimum=0.0,
        maximum=1e6,
    )
    trainer: dict[str, Json] | None = knob(
        "mapping",
        "TrainingArguments fields (per_device_train_batch_size, gradient_accumulation_steps, "
        "bf16, fp16, gradient_checkpointing, optim, max_grad_norm), mapped to the knobs "
        "(they win over the knobs they set)",
    )

    distributed: dict[str, Json] | None = knob(
        "mapping",
        'several GPUs of one host, one experiment: {"strategy": "ddp" | "fsdp", "gpus": N '
        '(2 to 8), "sharding": "full" | "hybrid" | "grad-op", "offload_optimizer": bool, '
        '"mixed_precision": "bf16"} (the last three fsdp only); batch_size is per GPU',
    )

    @property
    def seq_len_or_default(self) -> int:
        return self.seq_len or DEFAULT_SEQ_LEN

    @property
    def new_tokens_or_default(self) -> int:
        return self.new_tokens or DEFAULT_NEW_TOKENS

    @property
    def config_overrides(self) -> dict[str, Json]:
        return dict(self.config or {})

    @property
    def parallel(self) -> Distributed | None:
        """``distributed`` typed (None: one device)."""
        return None if self.distributed is None else Distributed.of(self.distributed)

    def replace(self, **changes: Any) -> ModelParams:
        """A copy with ``changes`` (field names to values)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ModelParams:
        return wire.load(cls, data, "params")

    @classmethod
    def of(cls, value: ModelParams | Mapping[str, Any]) -> ModelParams:
        """``value`` typed: a caller of the predictor or the builder (a benchmark, a test)
        may pass the params as the spec spells them."""
        return value if isinstance(value, ModelParams) else cls.from_wire(value)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = wire.dump(self)
        return out


def model_param_fields() -> tuple[dataclasses.Field[Any], ...]:
    """``ModelParams``' fields in the catalog's order, with what the catalog says of each."""
    return dataclasses.fields(ModelParams)


def model_default(name: str) -> Any:
    """The default of one ``ModelParams`` field (None where it has none)."""
    f = next(f for f in dataclasses.fields(ModelParams) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def model_maximum(name: str) -> int | None:
    """The largest value the catalog allows for a ``ModelParams`` int field."""
    f = next(f for f in dataclasses.fields(ModelParams) if f.name == name)
    top = f.metadata["maximum"]
    return None if top is None else int(top)


# The op's own params for every op but ``model``: what the catalog checked, by the op's
# parameter names (the catalog declares each op's; workers/ops reads its own).
OpParams = dict[str, Json]


@dataclass(frozen=True, kw_only=True)
class AllocatorSettings:
    """PyTorch caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF) for one experiment."""

    expandable_segments: bool | None = None
    max_split_size_mb: int | None = None
    garbage_collection_threshold: float | None = None
    roundup_power2_divisions: int | None = None
    backend: Literal["native", "cudaMallocAsync"] | None = None

    def settings(self) -> dict[str, bool | int | float | str]:
        """The settings the spec sets (left-out ones omitted), as the wire spells them."""
        return {k: v for k, v in wire.dump(self).items() if v is not None}

    def __bool__(self) -> bool:
        return bool(self.settings())


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What a worker runs: one op of the catalog (or a scenario, or a model's step) with
    its shapes, dtype, device and options, the prediction to check it against and the
    service's byte cap."""

    op: str
    shape: tuple[int, ...] = ()
    dtype: str = DEFAULT_DTYPE
    device: str = "cpu"
    # The op's parameters; for op ``model`` they are ``model`` instead (and this is empty).
    params: OpParams = field(default_factory=dict)
    model: ModelParams | None = None
    warmup: int = DEFAULT_WARMUP
    repeat: int = DEFAULT_REPEAT
    timeout_s: float = DEFAULT_TIMEOUT_S
    allocator: AllocatorSettings = field(default_factory=AllocatorSettings)
    trace: TraceMode = DEFAULT_TRACE
    isolation: Isolation = DEFAULT_ISOLATION
    # A scenario's steps (op ``scenario``), as the catalog checked them.
    steps: tuple[dict[str, Json], ...] | None = None
    prediction: Prediction | None = None
    # The service's cap on what the run may hold (VRAMLAB_MAX_EXPERIMENT_BYTES).
    memory_limit_bytes: int | None = None

    @property
    def is_model(self) -> bool:
        return self.op == MODEL_OP

    @property
    def is_scenario(self) -> bool:
        return self.op == "scenario"

    @property
    def traced(self) -> bool:
        return self.trace != "none"

    @property
    def shared(self) -> bool:
        return self.isolation == Isolation.SHARED

    @property
    def capacity_bytes(self) -> int | None:
        """A model run's emulated card (``capacity_bytes``), if it names one."""
        return self.model.capacity_bytes if self.model is not None else None

    @property
    def planned_devices(self) -> tuple[str, ...]:
        """The devices the prediction says the run's tensors use."""
        return tuple(self.prediction.devices) if self.prediction is not None else ()

    # What the generic layers need of some ops' own parameters, read here once.
    @property
    def pin_memory(self) -> bool:
        return bool(self.params.get("pin_memory"))

    @property
    def non_blocking(self) -> bool:
        return bool(self.params.get("non_blocking"))

    @property
    def source_device(self) -> str:
        return str(self.params.get("source_device") or "cpu")

    @property
    def cudnn_benchmark(self) -> bool:
        return bool(self.params.get("cudnn_benchmark"))

    @property
    def stops_on_error(self) -> bool:
        """A scenario's ``on_error``: stop at a failing step (the default) or go on."""
        return self.params.get("on_error", "stop") == "stop"

    def op_params(self) -> Mapping[str, Json]:
        """The op's parameters as the op's code reads them (a model's included)."""
        return self.model.wire() if self.model is not None else self.params

    def prediction_wire(self) -> dict[str, Any] | None:
        """The prediction as the API planned it, for the result (fields it left out
        omitted, as it stored them)."""
        if self.prediction is None:
            return None
        out: dict[str, Any] = {k: v for k, v in wire.dump(self.prediction).items() if v is not None}
        return out

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RunSpec:
        """A claim's ``spec`` (or what ``wire`` wrote) as a RunSpec; WireError if it does
        not fit."""
        raw = dict(data)
        params = raw.pop("params", None) or {}
        model = ModelParams.from_wire(params) if raw.get("op") == MODEL_OP else None
        prediction = raw.pop("prediction", None)
        raw["allocator"] = raw.get("allocator") or {}
        spec = wire.load(cls, {k: v for k, v in raw.items() if v is not None})
        return dataclasses.replace(
            spec,
            params={} if model else wire.load(OpParams, params, "params"),
            model=model,
            prediction=wire.load(Prediction, prediction, "prediction") if prediction else None,
        )

    def wire(self) -> dict[str, Any]:
        """The run spec as the claim sends it: the JSON it was before it was typed."""
        return {
            "op": self.op,
            "shape": list(self.shape),
            "params": dict(self.op_params()),
            "dtype": self.dtype,
            "device": self.device,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "timeout_s": self.timeout_s,
            "allocator": self.allocator.settings(),
            "trace": self.trace,
            "isolation": str(self.isolation),
            "steps": None if self.steps is None else [dict(s) for s in self.steps],
            "prediction": self.prediction_wire(),
            "memory_limit_bytes": self.memory_limit_bytes,
        }
