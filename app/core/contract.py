"""The contract's pydantic models, built once from :mod:`vramlab.contract`'s dataclasses.

The client ships the contract as plain dataclasses (it installs with httpx alone); the
API validates, stores and documents with these models, made here from those classes: the
same names, fields, defaults, bounds (each field's ``metadata``), docstrings and checks
(``vramlab.contract.VALIDATORS``), so the OpenAPI document is what it was when the
contract was written in pydantic. One copy of each shape: a field is added in the client.
"""

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from vramlab import contract as source


class ContractModel(BaseModel):
    """A model of the contract: unknown keys refused, aliases and names both accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        """The model as JSON-ready data, keys as the contract spells them (what was set)."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return data


_BUILT: dict[type, type[ContractModel]] = {}


def _translate(tp: Any) -> Any:
    """``tp`` with each contract dataclass in it replaced by its model."""
    if isinstance(tp, type) and tp in _BUILT:
        return _BUILT[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is None or origin is Literal:
        return tp
    if origin in (Union, types.UnionType):
        return Union[tuple(_translate(a) for a in args)]  # noqa: UP007 - built at runtime
    return origin[tuple(_translate(a) for a in args)]


def _model(cls: type) -> type[ContractModel]:
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        options = dict(f.metadata)
        if f.default is not dataclasses.MISSING:
            options["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        fields[f.name] = (_translate(hints[f.name]), Field(**options))
    validators: dict[str, Any] = {}
    check = source.VALIDATORS.get(cls)
    if check is not None:

        def checked(self: ContractModel) -> ContractModel:
            check(self)
            return self

        validators["_checked"] = model_validator(mode="after")(checked)
    model: type[ContractModel] = create_model(
        cls.__name__,
        __base__=ContractModel,
        __doc__=cls.__doc__,
        __module__=__name__,
        __validators__=validators,
        **fields,
    )
    # The class's own helpers (Result.shared_process_figures) read attributes: they serve
    # the model as they serve the dataclass.
    for name, value in vars(cls).items():
        if callable(value) and not name.startswith("_") and name != "wire":
            setattr(model, name, value)
    _BUILT[cls] = model
    return model


for _cls in source.CONTRACT_TYPES:
    globals()[_cls.__name__] = _model(_cls)

if TYPE_CHECKING:  # built above; to mypy, models whose fields it reads as Any
    _Any: Any = ContractModel

    class _Built(_Any): ...

    class SectionFigures(_Built): ...

    class MemoryFigures(_Built): ...

    class Phase(_Built): ...

    class Timing(_Built): ...

    class Environment(_Built): ...

    class Categories(_Built): ...

    class PhasePeak(_Built): ...

    class ModelStep(_Built): ...

    class ModelFigures(_Built): ...

    class TensorPrediction(_Built): ...

    class StepPrediction(_Built): ...

    class Prediction(_Built): ...

    class TensorInfo(_Built): ...

    class TraceSummary(_Built): ...

    class Copy(_Built): ...

    class HeldTensor(_Built): ...

    class MoreTensors(_Built): ...

    class Placement(_Built): ...

    class ErrorInfo(_Built): ...

    class Step(_Built): ...

    class Result(_Built): ...

    class SnapshotFigures(_Built): ...

    class SnapshotResult(_Built): ...

    class Outcome(_Built): ...
