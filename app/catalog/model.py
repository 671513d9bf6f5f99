"""The shapes of catalog data: parameters, op entries and the tensors an op makes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.catalog.rounding import rounded_block_bytes
from app.core.contract import Prediction, TensorPrediction
from vramlab.catalog.devices import canonical_device, parse_device
from vramlab.catalog.dtypes import COMPLEX_DTYPES, DTYPES, FLOATING_DTYPES, itemsize
from vramlab.catalog.errors import CatalogError
from vramlab.runspec import MAX_DIM_SIZE, MAX_DIMS, ParamKind

# Dtypes autograd can differentiate (float8 cannot).
GRAD_DTYPES = tuple(d for d in (*FLOATING_DTYPES, *COMPLEX_DTYPES) if not d.startswith("float8"))


MAX_TEXT = 200
# A mapping param (a model's config overrides): bounded in keys, nesting and sizes.
MAX_MAPPING_KEYS = 64
MAX_MAPPING_LIST = 64


def _check_mapping_value(value: Any, field: str) -> Any:
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise CatalogError(field, f"is longer than {MAX_TEXT} characters")
        return value
    if isinstance(value, int | float):
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise CatalogError(field, "must fit in 64 bits")
        if isinstance(value, float) and not math.isfinite(value):
            raise CatalogError(field, "must be finite")
        return value
    if isinstance(value, list):
        if len(value) > MAX_MAPPING_LIST:
            raise CatalogError(field, f"has {len(value)} items; at most {MAX_MAPPING_LIST}")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, list | dict):
                raise CatalogError(f"{field}[{i}]", "must be a number, string, bool or null")
            out.append(_check_mapping_value(item, f"{field}[{i}]"))
        return out
    raise CatalogError(field, "must be a number, string, bool, null or a list of them")


def check_shape(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or isinstance(value, str):
        raise CatalogError(field, "must be a list of non-negative integers")
    if len(value) > MAX_DIMS:
        raise CatalogError(field, f"has {len(value)} dims; at most {MAX_DIMS} are allowed")
    dims: list[int] = []
    for i, dim in enumerate(value):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise CatalogError(f"{field}[{i}]", "must be an integer")
        if dim < 0 or dim > MAX_DIM_SIZE:
            raise CatalogError(f"{field}[{i}]", f"must be between 0 and {MAX_DIM_SIZE}")
        dims.append(dim)
    return tuple(dims)


@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind
    description: str
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    required: bool = False

    def check(self, value: Any, field: str) -> Any:
        """Return the value in its canonical form or raise CatalogError."""
        if value is None:
            if self.required:
                raise CatalogError(field, "is required")
            return self.default
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise CatalogError(field, "must be true or false")
            return value
        if self.kind in ("int", "float"):
            ok = isinstance(value, int) if self.kind == "int" else isinstance(value, int | float)
            if isinstance(value, bool) or not ok:
                raise CatalogError(
                    field, f"must be a{'n integer' if self.kind == 'int' else ' number'}"
                )
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise CatalogError(field, "must fit in 64 bits")
            if not math.isfinite(value):
                raise CatalogError(field, "must be finite")
            if self.minimum is not None and value < self.minimum:
                raise CatalogError(field, f"must be >= {self.minimum:g}")
            if self.maximum is not None and value > self.maximum:
                raise CatalogError(field, f"must be <= {self.maximum:g}")
            return value
        if self.kind == "shape":
            return list(check_shape(value, field))
        if self.kind == "dtype":
            if not isinstance(value, str) or value not in DTYPES:
                raise CatalogError(field, f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
            return value
        if self.kind == "device":
            if not isinstance(value, str):
                raise CatalogError(field, "must be a device string such as 'cpu' or 'cuda:0'")
            try:
                return canonical_device(value)
            except ValueError as exc:
                raise CatalogError(field, str(exc)) from exc
        if self.kind == "text":
            if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
                raise CatalogError(field, f"must be a string of 1 to {MAX_TEXT} characters")
            return value
        if self.kind == "document":  # a whole config.json: its own bounded checks
            from app.catalog.finetune import check_document

            return check_document(value, field)
        if self.kind == "mapping":
            if isinstance(value, str) and value in self.choices:  # a named shorthand
                return value
            if not isinstance(value, dict):
                raise CatalogError(field, "must be an object of names to values")
            if len(value) > MAX_MAPPING_KEYS:
                raise CatalogError(field, f"has {len(value)} keys; at most {MAX_MAPPING_KEYS}")
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not key.isidentifier() or len(key) > 64:
                    raise CatalogError(f"{field}.{key[:64]}", "is not a config name")
                out[key] = _check_mapping_value(item, f"{field}.{key}")
            return out
        if value not in self.choices:
            raise CatalogError(field, f"must be one of {', '.join(self.choices)}")
        return value

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "required": self.required,
        }
        if self.default is not None:
            out["default"] = self.default
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.choices:
            out["choices"] = list(self.choices)
        return out


@dataclass(frozen=True)
class TensorSpec:
    """A tensor an op holds: an input made in set-up or an output the op returns."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)

    @property
    def device_type(self) -> str:
        return parse_device(self.device)[0]

    @property
    def block_bytes(self) -> int:
        return rounded_block_bytes(self.nbytes, self.device_type)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "bytes": self.nbytes,
        }


@dataclass(frozen=True)
class TensorPlan:
    """What an op is predicted to hold: its inputs (set-up) and outputs (kept after)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Devices the op needs beyond those its tensors name (pinned host memory needs CUDA).
    extra_devices: tuple[str, ...] = ()
    # What the prediction leaves out (a workspace, saved activations): said, not hidden.
    caveats: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.caveats

    def with_grads(self) -> TensorPlan:
        """The plan with autograd on: each floating input gets a .grad of its own shape."""
        grads = tuple(
            TensorSpec(f"grad_{t.name}", t.shape, t.dtype, t.device)
            for t in self.inputs
            if t.dtype in GRAD_DTYPES
        )
        caveat = "what autograd saves for backward, and backward's temporaries, are measured"
        return replace(self, outputs=(*self.outputs, *grads), caveats=(*self.caveats, caveat))

    @property
    def devices(self) -> tuple[str, ...]:
        names = {t.device for t in (*self.inputs, *self.outputs)} | set(self.extra_devices)
        return tuple(sorted(names))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in (*self.inputs, *self.outputs))

    def prediction(self, device: str) -> dict[str, Any]:
        """Predicted allocator figures on ``device`` (a canonical device string)."""
        on_device_in = sum(t.block_bytes for t in self.inputs if t.device == device)
        on_device_out = sum(t.block_bytes for t in self.outputs if t.device == device)
        on_host = sum(t.nbytes for t in (*self.inputs, *self.outputs) if t.device == "cpu")
        prediction = Prediction(
            label="prediction",
            device=device,
            allocated_before=on_device_in,
            delta_allocated=on_device_out,
            allocated_after=on_device_in + on_device_out,
            host_tensor_bytes=on_host,
            inputs=[TensorPrediction.model_validate(t.as_dict()) for t in self.inputs],
            outputs=[TensorPrediction.model_validate(t.as_dict()) for t in self.outputs],
            rounding="CUDA blocks rounded up to 512 bytes" if device != "cpu" else "none",
            devices=list(self.devices),
            exact=self.exact,
            caveats=list(self.caveats),
        )
        return prediction.model_dump(exclude_unset=True)


PlanFn = Callable[[tuple[int, ...], Mapping[str, Any], str, str], TensorPlan]


@dataclass(frozen=True)
class OpEntry:
    name: str
    summary: str
    plan_fn: PlanFn
    params: tuple[Param, ...] = ()
    dtypes: tuple[str, ...] = tuple(DTYPES)
    devices: tuple[str, ...] = ("cpu", "cuda")
    min_dims: int = 0
    tags: tuple[str, ...] = field(default=())
    # Turns the checked params into the knobs the worker reads (a vocabulary, shorthands).
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def check_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(params) - set(known))
        if unknown:
            allowed = ", ".join(known) or "none"
            raise CatalogError(
                f"params.{unknown[0]}",
                f"unknown parameter for op {self.name!r}; allowed: {allowed}",
            )
        checked = {name: p.check(params.get(name), f"params.{name}") for name, p in known.items()}
        return self.normalize(checked) if self.normalize is not None else checked

    def plan(
        self, shape: tuple[int, ...], params: Mapping[str, Any], dtype: str, device: str
    ) -> TensorPlan:
        if len(shape) < self.min_dims:
            raise CatalogError("shape", f"op {self.name!r} needs at least {self.min_dims} dims")
        if dtype not in self.dtypes:
            raise CatalogError(
                "dtype",
                f"op {self.name!r} does not take {dtype!r}; allowed: {', '.join(self.dtypes)}",
            )
        kind = parse_device(device)[0]
        if kind not in self.devices:
            raise CatalogError("device", f"op {self.name!r} runs on: {', '.join(self.devices)}")
        plan = self.plan_fn(shape, params, dtype, device)
        return plan.with_grads() if params.get("requires_grad") else plan

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "params": [p.describe() for p in self.params],
            "dtypes": list(self.dtypes),
            "devices": list(self.devices),
            "min_dims": self.min_dims,
            "tags": list(self.tags),
        }
