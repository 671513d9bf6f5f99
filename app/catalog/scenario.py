"""Scenarios: a list of named-tensor steps, validated as data and planned without torch.

A spec with ``op: "scenario"`` carries ``steps`` instead of one op's shape and params.
Each step is a dict with ``do`` (create, op, move, pin, delete, empty_cache, synchronize,
repeat) and its fields; names refer to tensors earlier steps made. Nothing is evaluated:
every function a step names comes from the fixed tables below. The plan predicts the
bytes the named tensors hold after each top-level step, and the most they hold at once,
inside a step included (``x = exp(x)`` holds the old and the new ``x`` for a moment).
Planning is linear in what the steps touch, and that is bounded (MAX_TENSOR_STEPS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vramlab.contract import Prediction, StepPrediction

from app.catalog.devices import canonical_device
from app.catalog.dtypes import DTYPES, fill_problem
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec, check_shape
from app.catalog.rounding import rounded_block_bytes
from app.catalog.shapes import broadcast, matmul_shape, norm_dim

MAX_TOP_STEPS = 64
MAX_WRITTEN_STEPS = 500  # step objects in a spec, repeat bodies included
# Steps the planner runs one by one, the rest being counted once repeats cycle: what
# bounds planning's own time (a few milliseconds per thousand).
MAX_PLANNED_STEPS = 2000
MAX_EXECUTED_STEPS = 20_000
MAX_REPEAT_DEPTH = 2
MAX_LIST = 4096
# A spec's whole work, in tensor-steps: each step run counts 1 and each tensor it makes,
# binds or frees counts 1 (a list of 4,096 made 20,000 times would be 82 million). The
# worker does that work; the planner's own cost is linear in the steps it runs, and a
# repeat block stops planning once its iterations repeat (see _repeat).
MAX_TENSOR_STEPS = 300_000
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

CREATE_FNS = ("empty", "zeros", "ones", "randn", "full")
BINARY_FNS = ("add", "mul", "matmul")
UNARY_FNS = ("relu", "exp", "sigmoid", "sum", "clone", "transpose_contiguous")
INPLACE_FNS = ("add_", "mul_")
VIEW_FNS = ("narrow",)
OP_FNS = (*BINARY_FNS, *UNARY_FNS, *INPLACE_FNS, *VIEW_FNS)
STEP_KINDS = ("create", "op", "move", "pin", "delete", "empty_cache", "synchronize", "repeat")
_FIELDS: dict[str, set[str]] = {
    "create": {"name", "fn", "shape", "dtype", "device", "count", "value", "pin_memory"},
    "op": {"name", "fn", "args", "dim", "start", "length"},
    "move": {"name", "src", "device", "dtype", "non_blocking"},
    "pin": {"name", "src"},
    "delete": {"name", "every"},
    "empty_cache": set(),
    "synchronize": set(),
    "repeat": {"times", "steps"},
}
_ALLOWED = {kind: fields | {"do", "label"} for kind, fields in _FIELDS.items()}


@dataclass
class _Storage:
    key: int
    device: str
    block: int  # its bytes as the allocator rounds them on its device


@dataclass
class _Tensor:
    spec: TensorSpec
    storage: _Storage  # shared with its views and with names bound to it


@dataclass(frozen=True)
class _Many:
    """A list of alike tensors from one create with a count (or what delete left of it).
    Each has its own storage and no other name can hold one (steps take single tensors),
    so they are counted rather than kept one by one: a step on a list costs one unit."""

    spec: TensorSpec
    block: int
    count: int


_Value = _Tensor | _Many


def _size(value: _Value | None) -> int:
    return 0 if value is None else 1 if isinstance(value, _Tensor) else value.count


@dataclass
class _State:
    """The named tensors, and the bytes their storages hold per device, kept up to date
    as names are bound and dropped: each step costs what it touches, not every name."""

    dtype: str
    device: str
    names: dict[str, _Value] = field(default_factory=dict)
    next_key: int = 0
    executed: int = 0  # steps the worker will run
    planned: int = 0  # steps planned one by one (the rest were counted: see _repeat)
    work: int = 0  # tensor-steps: steps run plus tensors bound or dropped
    peak: int = 0  # the most held at once on the scenario's device, inside steps included
    peak_all: int = 0  # the most held at once on every device together
    refs: dict[int, int] = field(default_factory=dict)  # storage key -> names holding it
    held: dict[str, int] = field(default_factory=dict)  # device -> bytes of live storages

    def new(self, shape: tuple[int, ...], dtype: str, device: str) -> _Tensor:
        spec = TensorSpec("t", shape, dtype, device)
        return self.tensor(spec)

    def tensor(self, spec: TensorSpec) -> _Tensor:
        self.next_key += 1
        block = rounded_block_bytes(spec.nbytes, "cuda" if spec.device != "cpu" else "cpu")
        return _Tensor(spec, _Storage(self.next_key, spec.device, block))

    def charge(self, units: int, where: str) -> None:
        self.work += units
        if self.work > MAX_TENSOR_STEPS:
            raise CatalogError(
                "steps",
                f"the scenario does too much: over {MAX_TENSOR_STEPS:,} tensor-steps by {where} "
                f"(each step run counts 1, and each tensor it makes, binds to a name or frees "
                f"counts 1); use fewer or shorter lists, or fewer repeats",
            )

    def bind(self, name: str, value: _Value, where: str) -> None:
        """Bind ``name`` to a new value. It exists before the old one goes (``x = exp(x)``
        holds both for a moment), so the peak is taken in between."""
        old = self.names.get(name)
        self.charge(_size(value) + _size(old), where)
        self._hold(value, 1)
        self.names[name] = value
        self.mark()
        if old is not None:
            self._hold(old, -1)

    def drop(self, name: str, where: str) -> None:
        old = self.names.pop(name, None)
        self.charge(_size(old), where)
        if old is not None:
            self._hold(old, -1)

    def live(self, device: str) -> int:
        return self.held.get(device, 0)

    def signature(self, names: frozenset[str]) -> tuple[Any, ...]:
        """What the next iteration of a repeat block that binds ``names`` depends on: the
        bytes held, and those names' tensors with how their storages are shared."""
        keys: dict[int, int] = {}
        out: list[Any] = [tuple(sorted(self.held.items()))]
        for name in sorted(names):
            value = self.names.get(name)
            if value is None or isinstance(value, _Many):
                out.append(value)
                continue
            key = value.storage.key
            index = keys.setdefault(key, len(keys))
            out.append((value.spec, value.storage.block, index, self.refs[key]))
        return tuple(out)

    def mark(self) -> None:
        self.peak = max(self.peak, self.held.get(self.device, 0))
        self.peak_all = max(self.peak_all, sum(self.held.values()))

    def _hold(self, value: _Value, sign: int) -> None:
        if isinstance(value, _Many):
            device = value.spec.device
            self.held[device] = self.held.get(device, 0) + sign * value.count * value.block
            return
        s = value.storage
        n = self.refs.get(s.key, 0) + sign
        if n:
            self.refs[s.key] = n
        else:
            del self.refs[s.key]
        if n == 0 or (n == 1 and sign > 0):
            self.held[s.device] = self.held.get(s.device, 0) + sign * s.block


def _get(step: Mapping[str, Any], key: str, where: str, kind: type, default: Any = None) -> Any:
    value = step.get(key, default)
    if value is None:
        if default is None:
            raise CatalogError(f"{where}.{key}", "is required")
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CatalogError(f"{where}.{key}", "must be an integer")
    if kind is bool and not isinstance(value, bool):
        raise CatalogError(f"{where}.{key}", "must be true or false")
    if kind is str and not isinstance(value, str):
        raise CatalogError(f"{where}.{key}", "must be a string")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise CatalogError(f"{where}.{key}", "must be a number")
    return value


def _name(step: Mapping[str, Any], key: str, where: str) -> str:
    name = _get(step, key, where, str)
    if not _NAME.match(name):
        raise CatalogError(f"{where}.{key}", "must be an identifier of at most 32 characters")
    return str(name)


def _one(state: _State, step: Mapping[str, Any], key: str, where: str, name: str) -> _Tensor:
    if name not in state.names:
        raise CatalogError(f"{where}.{key}", f"no tensor named {name!r} at this step")
    value = state.names[name]
    if isinstance(value, _Many):
        raise CatalogError(f"{where}.{key}", f"{name!r} is a list; only delete takes a list")
    return value


def _device(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CatalogError(where, "must be a device string")
    try:
        return canonical_device(value)
    except ValueError as exc:
        raise CatalogError(where, str(exc)) from None


def _dtype(value: Any, where: str) -> str:
    if value not in DTYPES:
        raise CatalogError(where, f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
    return str(value)


def _create(state: _State, step: Mapping[str, Any], where: str) -> None:
    fn = _get(step, "fn", where, str, "empty")
    if fn not in CREATE_FNS:
        raise CatalogError(f"{where}.fn", f"must be one of {', '.join(CREATE_FNS)}")
    shape = check_shape(step.get("shape"), f"{where}.shape")
    dtype = _dtype(step.get("dtype") or state.dtype, f"{where}.dtype")
    device = _device(step.get("device") or state.device, f"{where}.device")
    count = _get(step, "count", where, int, 1)
    if not 1 <= count <= MAX_LIST:
        raise CatalogError(f"{where}.count", f"must be between 1 and {MAX_LIST}")
    if _get(step, "pin_memory", where, bool, False) and device != "cpu":
        raise CatalogError(f"{where}.pin_memory", "only a tensor on the CPU can be pinned")
    value = _get(step, "value", where, float, 0.0)
    if fn == "full" and (why := fill_problem(value, dtype)) is not None:
        raise CatalogError(f"{where}.value", why)
    name = _name(step, "name", where)
    # The worker frees what the name held before it makes the new tensors.
    state.drop(name, where)
    spec = TensorSpec("t", shape, dtype, device)
    if count == 1:
        state.bind(name, state.tensor(spec), where)
    else:
        block = rounded_block_bytes(spec.nbytes, "cuda" if device != "cpu" else "cpu")
        state.bind(name, _Many(spec, block, count), where)


def _op(state: _State, step: Mapping[str, Any], where: str) -> None:
    fn = _get(step, "fn", where, str)
    if fn not in OP_FNS:
        raise CatalogError(f"{where}.fn", f"must be one of {', '.join(OP_FNS)}")
    args = step.get("args")
    arity = 2 if fn in _TWO_ARGS else 1
    if (
        not isinstance(args, list)
        or len(args) != arity
        or not all(isinstance(a, str) for a in args)
    ):
        raise CatalogError(f"{where}.args", f"{fn} takes {arity} tensor name(s)")
    ts = [_one(state, step, "args", where, a) for a in args]
    devices = {t.spec.device for t in ts}
    if len(devices) > 1:
        raise CatalogError(
            f"{where}.args",
            f"inputs on {' and '.join(sorted(devices))}: PyTorch refuses ops across devices "
            f"(the mixed_device op shows its error)",
        )
    a = ts[0]
    out_name = (
        _name(step, "name", where) if fn not in INPLACE_FNS else str(step.get("name") or args[0])
    )
    if fn in INPLACE_FNS:
        if broadcast(a.spec.shape, ts[1].spec.shape, f"{where}.args") != a.spec.shape:
            raise CatalogError(f"{where}.args", "the second operand must broadcast to the first")
        state.bind(out_name, a, where)
        return
    if fn in BINARY_FNS:
        f = broadcast if fn != "matmul" else matmul_shape
        shape = f(a.spec.shape, ts[1].spec.shape, f"{where}.args")
    elif fn == "sum":
        shape = ()
    elif fn == "transpose_contiguous":
        if len(a.spec.shape) < 2:
            raise CatalogError(f"{where}.args", "transpose needs at least 2 dims")
        shape = (*a.spec.shape[:-2], a.spec.shape[-1], a.spec.shape[-2])
    elif fn == "narrow":
        d = norm_dim(_get(step, "dim", where, int, 0), len(a.spec.shape), f"{where}.dim")
        start, length = _get(step, "start", where, int, 0), _get(step, "length", where, int, 1)
        if start < 0 or length < 0 or start + length > a.spec.shape[d]:
            raise CatalogError(f"{where}.length", "start + length must lie within the dim")
        view_shape = tuple(length if i == d else n for i, n in enumerate(a.spec.shape))
        # A view: same storage as its base, which it keeps alive.
        view = _Tensor(TensorSpec("t", view_shape, a.spec.dtype, a.spec.device), a.storage)
        state.bind(out_name, view, where)
        return
    else:
        shape = a.spec.shape
    dtype = a.spec.dtype
    if fn == "sum" and dtype in ("bool", "uint8", "int8", "int16", "int32"):
        dtype = "int64"
    state.bind(out_name, state.new(shape, dtype, a.spec.device), where)


def _move(state: _State, step: Mapping[str, Any], where: str) -> None:
    src = _one(state, step, "src", where, _name(step, "src", where))
    device = _device(step.get("device") or state.device, f"{where}.device")
    dtype = _dtype(step.get("dtype") or src.spec.dtype, f"{where}.dtype")
    _get(step, "non_blocking", where, bool, False)
    same = device == src.spec.device and dtype == src.spec.dtype
    moved = src if same else state.new(src.spec.shape, dtype, device)
    state.bind(_name(step, "name", where), moved, where)


def _pin(state: _State, step: Mapping[str, Any], where: str) -> None:
    src = _one(state, step, "src", where, _name(step, "src", where))
    if src.spec.device != "cpu":
        raise CatalogError(f"{where}.src", "only a tensor on the CPU can be pinned")
    pinned = state.new(src.spec.shape, src.spec.dtype, "cpu")
    state.bind(_name(step, "name", where), pinned, where)


def _delete(state: _State, step: Mapping[str, Any], where: str) -> None:
    name = _name(step, "name", where)
    if name not in state.names:
        raise CatalogError(f"{where}.name", f"no tensor named {name!r} at this step")
    every = step.get("every")
    if every is None:
        state.drop(name, where)
        return
    every = _get(step, "every", where, int)
    if every < 1:
        raise CatalogError(f"{where}.every", "must be >= 1")
    # Delete elements 0, every, 2*every, ...: the rest stay, leaving holes between them.
    value = state.names[name]
    left = _size(value) - -(-_size(value) // every)
    state.drop(name, where)  # what stays is part of what was there: no new peak
    if left == 1 and isinstance(value, _Many):
        state.bind(name, state.tensor(value.spec), where)  # one alike tensor: a single
    else:
        spec = value.spec
        block = value.block if isinstance(value, _Many) else value.storage.block
        state.bind(name, _Many(spec, block, left), where)


def _run(state: _State, steps: Any, where: str, depth: int) -> list[StepPrediction]:
    if not isinstance(steps, list) or not steps:
        raise CatalogError(where, "must be a non-empty list of steps")
    if depth == 0 and len(steps) > MAX_TOP_STEPS:
        raise CatalogError(where, f"at most {MAX_TOP_STEPS} top-level steps")
    out: list[StepPrediction] = []
    for i, step in enumerate(steps):
        at = f"{where}[{i}]"
        if not isinstance(step, dict):
            raise CatalogError(at, "must be an object with a 'do' field")
        kind = step.get("do")
        if kind not in STEP_KINDS:
            raise CatalogError(f"{at}.do", f"must be one of {', '.join(STEP_KINDS)}")
        unknown = step.keys() - _ALLOWED[kind]
        if unknown:
            raise CatalogError(
                f"{at}.{min(unknown)}",
                f"unknown field for {kind}; allowed: "
                f"{', '.join(sorted(_FIELDS[kind] | {'label'})) or 'label'}",
            )
        label = step.get("label")
        if label is not None and (not isinstance(label, str) or not 0 < len(label) <= 64):
            raise CatalogError(f"{at}.label", "must be a string of 1 to 64 characters")
        state.executed += 1
        state.planned += 1
        if state.planned > MAX_PLANNED_STEPS:
            raise CatalogError(
                "steps",
                f"planning would take more than {MAX_PLANNED_STEPS} steps one by one: a "
                f"repeat block is planned until its iterations cycle, and this one changes "
                f"its tensors for too long (delete fewer elements per iteration, or write "
                f"a shorter block)",
            )
        if state.executed > MAX_EXECUTED_STEPS:
            raise CatalogError(where, f"runs more than {MAX_EXECUTED_STEPS} steps in all")
        state.charge(1, at)
        if kind == "repeat":
            if depth + 1 > MAX_REPEAT_DEPTH:
                raise CatalogError(at, f"repeat blocks nest at most {MAX_REPEAT_DEPTH} deep")
            times = _get(step, "times", at, int)
            if not 1 <= times <= MAX_EXECUTED_STEPS:
                raise CatalogError(f"{at}.times", f"must be between 1 and {MAX_EXECUTED_STEPS}")
            _repeat(state, step.get("steps"), times, at, depth + 1)
        elif kind in _HANDLERS:
            _HANDLERS[kind](state, step, at)
        state.mark()
        if depth == 0:
            live = state.live(state.device)
            out.append(
                StepPrediction(
                    label=label or step_title(step),
                    allocated_after=live,
                    host_tensor_bytes=state.live("cpu") if state.device != "cpu" else None,
                )
            )
    return out


def _repeat(state: _State, steps: Any, times: int, at: str, depth: int) -> None:
    """Run a repeat block's steps ``times`` times, but stop once the state after an
    iteration matches the state after an earlier one: from there the iterations cycle
    (same tensors, same bytes, same peaks), so the rest are counted, not planned."""
    where = f"{at}.steps"
    _run(state, steps, where, depth)  # the first iteration validates the steps
    bound = _bound_names(steps)
    seen: dict[tuple[Any, ...], tuple[int, int, int]] = {}
    done = 1
    while done < times:
        sig = state.signature(bound)
        if sig in seen:
            first, executed, work = seen[sig]
            period = done - first
            cycles = (times - done) // period
            per_executed, per_work = state.executed - executed, state.work - work
            state.executed += cycles * per_executed
            if state.executed > MAX_EXECUTED_STEPS:
                raise CatalogError(where, f"runs more than {MAX_EXECUTED_STEPS} steps in all")
            state.charge(cycles * per_work, at)
            done += cycles * period
            seen.clear()  # what is left (less than a period) runs step by step
            if done >= times:
                break
        else:
            seen[sig] = (done, state.executed, state.work)
        _run(state, steps, where, depth)
        done += 1


def _written(steps: Any, depth: int) -> int:
    """How many step objects a spec writes, repeat bodies included (not yet validated:
    anything that is not a list of steps counts as what it is, and _run refuses it)."""
    if not isinstance(steps, list) or depth > MAX_REPEAT_DEPTH:
        return 0
    inner = (s.get("steps") for s in steps if isinstance(s, dict) and s.get("do") == "repeat")
    return len(steps) + sum(_written(body, depth + 1) for body in inner)


def _bound_names(steps: list[dict[str, Any]]) -> frozenset[str]:
    """The names a (validated) block of steps binds or drops, nested blocks included."""
    found: set[str] = set()
    for step in steps:
        if step["do"] == "repeat":
            found |= _bound_names(step["steps"])
        elif step["do"] in ("create", "move", "pin", "delete"):
            found.add(step["name"])
        elif step["do"] == "op":
            found.add(step.get("name") or step["args"][0])
    return frozenset(found)


_TWO_ARGS = frozenset((*BINARY_FNS, *INPLACE_FNS))
_HANDLERS = {"create": _create, "op": _op, "move": _move, "pin": _pin, "delete": _delete}


def step_title(step: Mapping[str, Any]) -> str:
    """A short description of a step, used as its name when it has no label."""
    kind = step.get("do")
    if kind == "create":
        count = f"[{step.get('count')}]" if step.get("count", 1) != 1 else ""
        return f"create {step.get('name')}{count} = {step.get('fn', 'empty')}{step.get('shape')}"
    if kind == "op":
        return (
            f"{step.get('name') or step['args'][0]} = {step.get('fn')}({', '.join(step['args'])})"
        )
    if kind == "move":
        return f"{step.get('name')} = {step.get('src')}.to({step.get('device', '')})"
    if kind == "pin":
        return f"{step.get('name')} = {step.get('src')}.pin_memory()"
    if kind == "delete":
        every = f"[::{step['every']}]" if step.get("every") else ""
        return f"del {step.get('name')}{every}"
    if kind == "repeat":
        return f"repeat x{step.get('times')} ({len(step.get('steps') or [])} steps)"
    return str(kind)


@dataclass(frozen=True)
class ScenarioPlan:
    steps: list[dict[str, Any]]  # the validated steps, as stored and sent to the worker
    devices: tuple[str, ...]
    peak_bytes: int  # the most the named tensors hold at once, on the scenario's device
    total_bytes: int  # the most held on every device at once, for the service's cap
    prediction: dict[str, Any]
    work: int  # tensor-steps: steps run plus tensors made, bound or freed
    planned: int  # steps the planner ran one by one (its own cost)


def plan_scenario(steps: Any, dtype: str, device: str) -> ScenarioPlan:
    """Validate a scenario's steps and predict the named tensors' bytes after each step."""
    device = canonical_device(device)
    if _written(steps, 0) > MAX_WRITTEN_STEPS:
        raise CatalogError("steps", f"at most {MAX_WRITTEN_STEPS} steps written in all")
    state = _State(dtype, device)
    per_step = _run(state, steps, "steps", 0)
    devices = {device} | _walk_creates(steps)
    finals = state.live(device)
    # The scenario's device at its peak beside the others at the end, or all devices'
    # most at once, whichever is more: the figure the service's byte cap is checked on.
    total = max(state.peak + sum(state.live(d) for d in devices if d != device), state.peak_all)
    caveats = [
        "temporaries inside a step, library workspaces and the allocator's segments "
        "are measured, not predicted",
    ]
    prediction = Prediction(
        label="prediction",
        device=device,
        allocated_before=0,
        delta_allocated=finals,
        allocated_after=finals,
        peak_named_bytes=state.peak,
        host_tensor_bytes=state.live("cpu"),
        inputs=[],
        outputs=[],
        steps=per_step,
        rounding="CUDA blocks rounded up to 512 bytes" if device != "cpu" else "none",
        devices=sorted(devices),
        exact=False,
        caveats=caveats,
    )
    return ScenarioPlan(
        steps,
        tuple(sorted(devices)),
        state.peak,
        total,
        prediction.model_dump(exclude_unset=True),
        state.work,
        state.planned,
    )


def _walk_creates(steps: list[Any]) -> set[str]:
    """Devices the steps name beyond the scenario's own (pinned memory needs CUDA)."""
    found: set[str] = set()
    for step in steps:
        if step.get("do") == "repeat":
            found |= _walk_creates(step["steps"])
            continue
        if step.get("do") in ("create", "move") and step.get("device"):
            found.add(canonical_device(step["device"]))
        if step.get("do") == "pin" or step.get("pin_memory"):
            found.add("cuda:0")  # pinned host memory needs a CUDA driver
    return found


def _no_plan(
    shape: tuple[int, ...], params: Mapping[str, Any], dtype: str, device: str
) -> TensorPlan:
    raise CatalogError("steps", "a scenario is planned from its steps")


SCENARIO = OpEntry(
    name="scenario",
    summary="a list of named-tensor steps (create, op, move, pin, delete, empty_cache, "
    "synchronize, repeat); each step gets its own figures and a mark in the trace",
    plan_fn=_no_plan,
    params=(
        Param(
            "on_error",
            "choice",
            "stop at a failing step (the experiment fails) or record "
            "the error in the step and go on",
            default="stop",
            choices=("stop", "continue"),
        ),
    ),
    tags=("scenario",),
)
