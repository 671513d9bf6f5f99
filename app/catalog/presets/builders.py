"""The specs of the articles' code examples, one builder per example: plain data for
a device, a dtype and a size (``pick`` chooses a figure per size)."""

from __future__ import annotations

from typing import Any

from app.catalog.presets.preset import Builder, Spec


def pick(size: str, small: Any, medium: Any, large: Any) -> Any:
    return {"small": small, "medium": medium, "large": large}[size]


def square(size: str) -> list[int]:
    n = pick(size, 64, 4096, 8192)
    return [n, n]


def moved(device: str, dtype: str, size: str, **params: Any) -> Spec:
    on_cpu = device == "cpu"
    return {
        "op": "to",
        "shape": square(size),
        "params": {"copy": True, **params} if on_cpu else params,
        "dtype": dtype,
    }


def scenario(steps: list[dict[str, Any]], **extra: Any) -> Spec:
    return {"op": "scenario", "shape": [], "steps": steps, "repeat": 1, "warmup": 0, **extra}


def fragmentation(kind: str) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        m = pick(size, 4096, 1024 * 1024, 4 * 1024 * 1024)  # elements: 4 MiB of float32
        if kind in ("article", "empty_cache"):
            # The article's loop: allocate and free the same size 100 times, then ask big.
            steps: list[dict[str, Any]] = [
                {
                    "do": "repeat",
                    "times": 100,
                    "steps": [
                        {"do": "create", "name": "t", "fn": "randn", "shape": [m]},
                        {"do": "delete", "name": "t"},
                    ],
                },
            ]
            if kind == "empty_cache":
                steps.append({"do": "empty_cache"})
            steps.append({"do": "create", "name": "large", "fn": "randn", "shape": [100 * m]})
            return scenario(steps)
        # Holes: keep every other block, then ask for one larger than any hole.
        steps = [
            {"do": "create", "name": "xs", "fn": "empty", "shape": [m], "count": 64},
            {"do": "delete", "name": "xs", "every": 2},
            {"do": "create", "name": "large", "fn": "empty", "shape": [16 * m]},
            {"do": "empty_cache", "label": "empty_cache (cached holes go back)"},
        ]
        allocator = {"expandable_segments": True} if kind == "expandable" else {}
        return scenario(steps, allocator=allocator)

    return build


def cpu_then_cuda(device: str, dtype: str, size: str) -> Spec:
    shape = pick(size, [64, 64], [1000, 1000], [8192, 8192])
    return scenario(
        [
            {"do": "create", "name": "x", "fn": "randn", "shape": shape, "device": "cpu"},
            {"do": "move", "name": "x_dev", "src": "x", "device": device},
            {"do": "create", "name": "two", "fn": "full", "shape": [], "value": 2.0},
            {"do": "op", "name": "y", "fn": "mul", "args": ["x_dev", "two"]},
            {"do": "create", "name": "x_gpu", "fn": "randn", "shape": shape},
            {"do": "op", "name": "y_gpu", "fn": "mul", "args": ["x_gpu", "two"]},
        ]
    )


def non_blocking(device: str, dtype: str, size: str) -> Spec:
    shape = pick(size, [64, 64], [500, 500], [8192, 8192])
    return scenario(
        [
            {"do": "create", "name": "cpu_tensor", "fn": "randn", "shape": shape, "device": "cpu"},
            {"do": "create", "name": "gpu_tensor", "fn": "randn", "shape": shape},
            {
                "do": "move",
                "name": "copy",
                "src": "cpu_tensor",
                "device": device,
                "non_blocking": True,
            },
            {"do": "op", "name": "result", "fn": "mul", "args": ["copy", "gpu_tensor"]},
            {"do": "move", "name": "cpu_result", "src": "result", "device": "cpu"},
        ]
    )


def bf16(device: str, dtype: str, size: str) -> Spec:
    shape = pick(size, [64, 64], [1024, 1024], [8192, 8192])
    return scenario(
        [
            {"do": "create", "name": "t", "fn": "ones", "shape": shape, "device": "cpu"},
            {"do": "move", "name": "t_dev", "src": "t", "device": device},
            {"do": "op", "name": "y", "fn": "matmul", "args": ["t_dev", "t_dev"]},
            {"do": "op", "name": "s", "fn": "sum", "args": ["y"]},
        ],
        dtype=dtype,
    )


def gpu_copy_modified(device: str, dtype: str, size: str) -> Spec:
    return scenario(
        [
            {
                "do": "create",
                "name": "cpu_tensor",
                "fn": "ones",
                "shape": square(size),
                "device": "cpu",
            },
            {"do": "move", "name": "gpu_tensor", "src": "cpu_tensor", "device": device},
            {"do": "create", "name": "ten", "fn": "full", "shape": [1], "value": 10.0},
            {"do": "op", "fn": "mul_", "args": ["gpu_tensor", "ten"]},
        ]
    )


def add(device: str, dtype: str, size: str) -> Spec:
    return {"op": "add", "shape": pick(size, [64, 64], [1000, 1000], [8192, 8192])}


def matmul(device: str, dtype: str, size: str) -> Spec:
    a, b = pick(
        size, ([64, 128], [128, 32]), ([1000, 2000], [2000, 500]), ([8000, 16000], [16000, 4000])
    )
    return {"op": "matmul", "shape": a, "params": {"other_shape": b}}


def inplace(requires_grad: bool) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        return {
            "op": "add_",
            "shape": pick(size, [64, 64], [1000, 1000], [8192, 8192]),
            "params": {"requires_grad": requires_grad},
        }

    return build


def model(on_cpu: bool) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        batch = pick(size, 1, 1, 4096)
        if on_cpu:
            return {
                "op": "mixed_device",
                "shape": [batch, 1000],
                "params": {"case": "module_on_cpu"},
            }
        return {
            "op": "module_forward",
            "shape": [batch, 1000],
            "params": {"module": "mlp", "width": 500, "out_features": 100, "layers": 1},
        }

    return build


def from_numpy(device: str, dtype: str, size: str) -> Spec:
    shape = pick(size, [10, 10], [4096, 4096], [8192, 8192])
    params: dict[str, Any] = {"source_kind": "numpy", "source_dtype": dtype}
    if device == "cpu":
        params["copy"] = True
    return {"op": "to", "shape": shape, "params": params, "dtype": dtype}


def mixed(case: str) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        return {
            "op": "mixed_device",
            "shape": pick(size, [64], [1024, 1024], [8192, 8192]),
            "params": {"case": case},
        }

    return build


def dtype_matrix(device: str, dtype: str, size: str) -> Spec:
    return {
        "op": "dtype_support",
        "shape": pick(size, [8, 8], [64, 64], [1024, 1024]),
        "repeat": 1,
        "warmup": 0,
    }
