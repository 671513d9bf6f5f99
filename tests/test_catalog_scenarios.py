"""The torch-free catalog: scenario steps validated as data, presets, new ops' plans."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.catalog import CatalogError, plan_spec
from app.catalog.presets.articles import PRESETS
from app.catalog.presets.preset import PresetError
from app.catalog.scenario.bounds import MAX_PLANNED_STEPS, MAX_TENSOR_STEPS, MAX_WRITTEN_STEPS
from app.catalog.scenario.plan import plan_scenario


def test_a_scenario_predicts_named_bytes_after_each_step() -> None:
    steps = [
        {"do": "create", "name": "a", "fn": "ones", "shape": [256, 256]},
        {"do": "op", "name": "b", "fn": "matmul", "args": ["a", "a"]},
        {"do": "op", "name": "v", "fn": "narrow", "args": ["b"], "length": 1},
        {"do": "delete", "name": "b"},
        {"do": "delete", "name": "a"},
        {"do": "move", "name": "h", "src": "v", "device": "cpu"},
    ]
    plan = plan_scenario(steps, "float32", "cuda:0")
    after = [s["allocated_after"] for s in plan.prediction["steps"]]
    full = 256 * 256 * 4
    # The view keeps b's whole storage alive after del b; the move makes a host copy.
    assert after == [full, 2 * full, 2 * full, 2 * full, full, full]
    assert plan.prediction["host_tensor_bytes"] == 256 * 4
    assert plan.peak_bytes == 2 * full
    assert plan.devices == ("cpu", "cuda:0")


def test_repeat_lists_and_holes() -> None:
    steps = [
        {"do": "create", "name": "xs", "fn": "empty", "shape": [1000], "count": 10},
        {"do": "delete", "name": "xs", "every": 2},
        {
            "do": "repeat",
            "times": 3,
            "steps": [
                {"do": "create", "name": "t", "fn": "randn", "shape": [10]},
                {"do": "delete", "name": "t"},
            ],
        },
    ]
    plan = plan_scenario(steps, "float32", "cuda")
    block = -(-4000 // 512) * 512
    assert [s["allocated_after"] for s in plan.prediction["steps"]] == [
        10 * block,
        5 * block,
        5 * block,
    ]


@pytest.mark.parametrize(
    ("steps", "field", "words"),
    [
        ([{"do": "eval", "code": "import os"}], "steps[0].do", "must be one of"),
        ([{"do": "op", "name": "b", "fn": "__import__", "args": ["a"]}], "steps[0].fn", "one of"),
        ([{"do": "op", "name": "b", "fn": "relu", "args": ["nope"]}], "steps[0].args", "no tensor"),
        ([{"do": "create", "name": "a b", "shape": [1]}], "steps[0].name", "identifier"),
        ([{"do": "create", "name": "a", "shape": [1], "x": 1}], "steps[0].x", "unknown field"),
        (
            [
                {"do": "create", "name": "a", "shape": [4], "device": "cpu"},
                {"do": "create", "name": "b", "shape": [4]},
                {"do": "op", "name": "c", "fn": "add", "args": ["a", "b"]},
            ],
            "steps[2].args",
            "across devices",
        ),
        (
            [{"do": "repeat", "times": 30000, "steps": [{"do": "synchronize"}]}],
            "steps[0].times",
            "between",
        ),
        (
            [
                {
                    "do": "repeat",
                    "times": 2,
                    "steps": [
                        {
                            "do": "repeat",
                            "times": 2,
                            "steps": [
                                {"do": "repeat", "times": 2, "steps": [{"do": "synchronize"}]}
                            ],
                        }
                    ],
                }
            ],
            "steps[0].steps[0].steps[0]",
            "nest",
        ),
        ([], "steps", "non-empty"),
    ],
)
def test_bad_steps_are_refused_naming_the_field(
    steps: list[dict[str, object]], field: str, words: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        plan_scenario(steps, "float32", "cuda:0")
    assert caught.value.field == field
    assert words in caught.value.message


def test_every_preset_builds_on_cuda_and_on_cpu_or_says_why() -> None:
    for preset in PRESETS.values():
        assert preset.article in ("000", "001", "002", "003")
        assert preset.spec("cuda", None, "medium")["tags"][0] == f"preset:{preset.name}"
        if preset.needs_cuda:
            with pytest.raises(PresetError):
                preset.spec("cpu", None, "small")
        else:
            preset.spec("cpu", None, "small")
    articles = {p.article for p in PRESETS.values()}
    assert articles == {"000", "001", "002", "003"}


@pytest.mark.parametrize(
    ("op", "shape", "params", "out"),
    [
        ("conv2d", (1, 4, 8, 8), {"out_channels": 6, "stride": 2, "padding": 0}, [1, 6, 3, 3]),
        ("einsum", (2, 3, 4), {"equation": "bij,bjk->bik", "other_shape": [2, 4, 5]}, [2, 3, 5]),
        ("stack", (3, 4), {"count": 2, "dim": -1}, [3, 4, 2]),
        ("sum", (3, 4), {"dim": 0, "keepdim": True}, [1, 4]),
        ("cat", (3, 4), {"count": 5, "dim": 0}, [15, 4]),
    ],
)
def test_output_shapes(
    op: str, shape: tuple[int, ...], params: dict[str, object], out: list[int]
) -> None:
    _, plan = plan_spec(op, shape, params, "float32", "cpu")
    assert list(plan.outputs[0].shape) == out


def test_module_parameters_are_predicted_by_name() -> None:
    params = {"module": "transformer_block", "width": 128, "heads": 4, "optimizer": "adam"}
    _, plan = plan_spec("module_train_step", (2, 8, 32), params, "float32", "cuda")
    names = [t.name for t in plan.inputs]
    assert "param:self_attn.in_proj_weight" in names and "param:linear2.bias" in names
    grads = [t for t in plan.outputs if t.name.startswith("grad:")]
    states = [t for t in plan.outputs if t.name.startswith("state:")]
    assert len(states) == 2 * len(grads) == 2 * (len(plan.inputs) - 1)
    assert not plan.exact


def test_x_equals_exp_x_holds_the_old_and_the_new_x_during_the_step() -> None:
    steps = [
        {"do": "create", "name": "x", "fn": "randn", "shape": [1024, 1024]},
        {"do": "op", "name": "x", "fn": "exp", "args": ["x"]},
        {
            "do": "repeat",
            "times": 3,
            "steps": [{"do": "op", "name": "x", "fn": "exp", "args": ["x"]}],
        },
    ]
    plan = plan_scenario(steps, "float32", "cpu")
    one = 1024 * 1024 * 4
    assert [s["allocated_after"] for s in plan.prediction["steps"]] == [one, one, one]
    # exp makes the new x while the old one is still bound: both are alive at once.
    assert plan.peak_bytes == plan.prediction["peak_named_bytes"] == 2 * one
    assert plan.total_bytes == 2 * one


def test_rebinding_with_create_frees_the_old_tensors_first() -> None:
    # The worker drops the name before it makes the new tensors (workers/scenario.py).
    steps = [
        {"do": "create", "name": "x", "shape": [1024]},
        {"do": "create", "name": "x", "shape": [1024]},
    ]
    assert plan_scenario(steps, "float32", "cpu").peak_bytes == 4096


def _issue_scenario(times: int) -> list[dict[str, object]]:
    """The issue's 740-byte scenario: ten lists of 4,096, then thousands of cheap steps."""
    creates = [{"do": "create", "name": f"t{i}", "shape": [1], "count": 4096} for i in range(10)]
    return [*creates, {"do": "repeat", "times": times, "steps": [{"do": "empty_cache"}]}]


def test_the_issues_scenario_is_planned_without_rescanning_every_name() -> None:
    # 40,960 named tensors and 4,000 steps: the old planner summed every tensor after every
    # step (164 million visits, 40 s); now each step costs what it touches.
    plan = plan_scenario(_issue_scenario(4000), "float32", "cpu")
    assert plan.peak_bytes == 40_960 * 4
    assert plan.prediction["steps"][-1]["allocated_after"] == 40_960 * 4


def test_a_scenario_past_the_work_bound_is_refused_naming_it() -> None:
    steps = [
        {
            "do": "repeat",
            "times": 19_000,
            "steps": [{"do": "create", "name": "t", "shape": [1], "count": 4096}],
        }
    ]
    with pytest.raises(CatalogError) as caught:
        plan_scenario(steps, "float32", "cpu")
    assert caught.value.field == "steps"
    assert f"{MAX_TENSOR_STEPS:,} tensor-steps" in caught.value.message


def _unrolled(steps: list[dict[str, object]]) -> list[dict[str, object]]:
    """The same scenario with every repeat written out (one pass over a long block)."""
    out: list[dict[str, object]] = []
    for step in steps:
        if step["do"] == "repeat":
            body = _unrolled(step["steps"])  # type: ignore[arg-type]
            out.append({"do": "repeat", "times": 1, "steps": body * step["times"]})  # type: ignore[operator]
        else:
            out.append(step)
    return out


_X = {"do": "create", "name": "x", "fn": "randn", "shape": [6, 4]}
_BODIES: list[list[dict[str, object]]] = [
    [{"do": "op", "name": "x", "fn": "exp", "args": ["x"]}],
    [{"do": "op", "name": "x", "fn": "transpose_contiguous", "args": ["x"]}],  # period 2
    [
        {"do": "op", "name": "v", "fn": "narrow", "args": ["x"], "length": 1},
        {"do": "op", "name": "x", "fn": "relu", "args": ["x"]},
    ],
    [
        {"do": "create", "name": "xs", "shape": [100], "count": 9},
        {"do": "delete", "name": "xs", "every": 3},
        {"do": "op", "name": "y", "fn": "matmul", "args": ["x", "t"]},
        {"do": "op", "fn": "add_", "args": ["x", "x"]},
    ],
    [
        {"do": "move", "name": "h", "src": "x", "device": "cpu"},
        {"do": "move", "name": "x", "src": "h", "device": "cuda:0", "dtype": "float16"},
        {
            "do": "repeat",
            "times": 3,
            "steps": [{"do": "op", "name": "s", "fn": "sum", "args": ["x"]}],
        },
    ],
    [
        {"do": "delete", "name": "ys", "every": 2},
        {"do": "op", "name": "z", "fn": "mul", "args": ["x", "x"]},
    ],
]


@pytest.mark.parametrize("body", _BODIES)
@pytest.mark.parametrize("times", [1, 2, 3, 7, 50])
def test_a_repeat_is_planned_as_if_every_iteration_ran(
    body: list[dict[str, object]], times: int
) -> None:
    # The planner stops iterating once the state cycles; the figures must not change.
    setup = [
        _X,
        {"do": "create", "name": "t", "shape": [4, 3]},
        {"do": "create", "name": "ys", "shape": [16], "count": 40},
    ]
    steps = [*setup, {"do": "repeat", "times": times, "steps": body}, {"do": "delete", "name": "x"}]
    fast, slow = (plan_scenario(s, "float32", "cuda:0") for s in (steps, _unrolled(steps)))
    for plan in (fast, slow):  # the repeat's own title differs ("x50 (1 steps)")
        for entry in plan.prediction["steps"]:
            entry.pop("label")
    assert fast.prediction == slow.prediction
    assert (fast.peak_bytes, fast.total_bytes, fast.work) == (
        slow.peak_bytes,
        slow.total_bytes,
        slow.work,
    )


def test_a_spec_that_writes_too_many_steps_is_refused() -> None:
    body = [{"do": "synchronize"}] * MAX_WRITTEN_STEPS
    with pytest.raises(CatalogError) as caught:
        plan_scenario([{"do": "repeat", "times": 1, "steps": body}], "float32", "cpu")
    assert caught.value.field == "steps"
    assert f"at most {MAX_WRITTEN_STEPS} steps written" in caught.value.message


def test_repeats_that_do_not_cycle_soon_enough_are_refused() -> None:
    # Each iteration frees one more element, so no two states match until the list is
    # empty: 380 iterations of a 14-step body would be planned one by one, past the bound.
    relu = {"do": "op", "name": "x", "fn": "relu", "args": ["x"]}
    block: dict[str, object] = {
        "do": "repeat",
        "times": 1000,
        "steps": [{"do": "delete", "name": "xs", "every": 4096}] + [relu] * 13,
    }
    steps = [
        {"do": "create", "name": "xs", "shape": [8], "count": 380},
        {"do": "create", "name": "x", "shape": [8]},
        block,
    ]
    with pytest.raises(CatalogError) as caught:
        plan_scenario(steps, "float32", "cpu")
    assert f"more than {MAX_PLANNED_STEPS} steps one by one" in caught.value.message
    # A shorter block settles within the bound.
    block["steps"] = block["steps"][:2]  # type: ignore[index]
    plan = plan_scenario(steps, "float32", "cpu")
    assert plan.prediction["steps"][-1]["allocated_after"] == 32


_VOCABULARY: list[dict[str, object]] = [
    {"do": "op", "name": "x", "fn": "exp", "args": ["x"]},
    {"do": "op", "name": "x", "fn": "transpose_contiguous", "args": ["x"]},
    {"do": "op", "name": "y", "fn": "add", "args": ["x", "y"]},
    {"do": "op", "name": "v", "fn": "narrow", "args": ["x"], "length": 1},
    {"do": "op", "fn": "mul_", "args": ["x", "x"]},
    {"do": "op", "name": "s", "fn": "sum", "args": ["y"]},
    {"do": "move", "name": "h", "src": "x", "device": "cpu"},
    {"do": "move", "name": "x", "src": "h", "device": "cuda:0", "dtype": "float16"},
    {"do": "create", "name": "xs", "shape": [100], "count": 7},
    {"do": "create", "name": "x", "shape": [4, 6]},
    {"do": "delete", "name": "xs", "every": 2},
    {"do": "delete", "name": "xs", "every": 50},
    {"do": "delete", "name": "v"},
    {"do": "delete", "name": "x"},
    {"do": "empty_cache"},
]


@settings(max_examples=150, deadline=None)
@given(
    body=st.lists(st.sampled_from(_VOCABULARY), min_size=1, max_size=6),
    times=st.integers(min_value=1, max_value=20),
    nested=st.booleans(),
)
def test_any_repeat_plans_as_if_every_iteration_ran(
    body: list[dict[str, object]], times: int, nested: bool
) -> None:
    setup: list[dict[str, object]] = [
        {"do": "create", "name": "x", "shape": [4, 6]},
        {"do": "create", "name": "y", "shape": [4, 6]},
        {"do": "create", "name": "xs", "shape": [100], "count": 40},
    ]
    block: dict[str, object] = {"do": "repeat", "times": times, "steps": body}
    if nested:
        block = {"do": "repeat", "times": 3, "steps": [block, body[0]]}
    steps = [*setup, block, {"do": "empty_cache"}]

    def outcome(s: list[dict[str, object]]) -> object:
        try:
            plan = plan_scenario(s, "float32", "cuda:0")
        except CatalogError as exc:
            return exc.message  # the field differs: a written-out block counts steps anew
        for entry in plan.prediction["steps"]:
            entry.pop("label")
        return (plan.prediction, plan.peak_bytes, plan.total_bytes, plan.work)

    assert outcome(steps) == outcome(_unrolled(steps))


@pytest.mark.parametrize("value", [[1], {"a": 1}, 3])
def test_a_dtype_parameter_that_is_not_a_name_is_refused(value: object) -> None:
    # A list used to reach a dict look-up and raise TypeError: a 500 for one request.
    with pytest.raises(CatalogError) as caught:
        plan_spec("to", (4,), {"source_dtype": value}, "float32", "cpu")
    assert caught.value.field == "params.source_dtype"
