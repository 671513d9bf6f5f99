"""Predict a model experiment's peak without a device: its step, traced on fake tensors.

The model is built as the worker builds it (workers/models/build.py), under PyTorch's
FakeTensorMode: every tensor has its shape, dtype and storage size, and none has memory.
The optimizer's state is made as step 1 leaves it, then the reported step runs under the
category tally (workers/models/tally.py) with the CUDA caching allocator's 512-byte
rounding, which gives the peak and what held it. What no tensor holds is added from
what was measured on GPUs (cuBLAS's workspaces: one per thread that runs matmuls).

Run as ``python -m workers.models.predict``: a server of JSON lines on stdin/stdout,
one request ``{"id", "params", "device"}`` and one answer per line, for the API's warm
predictor child (app/experiments/predictor.py). The API never imports torch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from app.catalog import CatalogError
from app.catalog.model_zoo import resolve
from vramlab.contract import Category
from workers.models.build import DEFAULT_NEW_TOKENS, DEFAULT_SEQ_LEN, Built, build
from workers.models.cuda_semantics import CudaSemantics
from workers.models.steps import tally_step
from workers.models.tally import BLOCK, rounded

MiB = 2**20
# cuBLAS's workspace on CUDA (PyTorch's default size on Hopper), one per handle: the main
# thread's, and for training autograd's backward thread's own.
CUBLAS_WORKSPACE = 32 * MiB
SEGMENT = 2 * MiB
CAVEATS = (
    "predicted by running the step on fake tensors (no device) with the CUDA caching "
    "allocator's rounding; library workspaces are added from measurements on an H100",
)
CPU_CAVEAT = (
    "on the CPU, oneDNN's and other kernels' internal buffers are not predicted; "
    "the measured peak can be higher"
)


class FakeScaler:
    """GradScaler's memory without its host syncs (fake tensors have no values): the
    loss scaled, the gradients unscaled and checked in place, then the step."""

    def __init__(self, device: torch.device) -> None:
        self.scale_value = torch.full((), 65536.0, device=device)
        self.found_inf = torch.zeros((), device=device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        inv = self.scale_value.double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv)
        optimizer.step()

    def update(self) -> None:  # the scale stays: no values to judge it by
        return None


# Config keys that count a model's repeated blocks. A stack of identical blocks adds the
# same bytes per block to every phase's peak, so a deep model is traced at two shallow
# depths and each phase's peak extended in a straight line (exact on GPT-2, BERT and
# Llama stacks against tracing them whole); the largest phase wins.
LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")
SHALLOW = (2, 3)
DEEP_ENOUGH = 6  # fewer blocks than this are traced whole


def predict(params: Mapping[str, Any], device_type: str) -> dict[str, Any]:
    """The reported step's predicted peak allocated and reserved, and its categories."""
    started = time.perf_counter()
    cuda = device_type == "cuda"
    if cuda and params.get("optimizer_impl", "default") == "default":
        # PyTorch's default on CUDA is the foreach implementation (for-loop on the CPU).
        params = {**params, "optimizer_impl": "foreach"}
    new_tokens = int(params.get("new_tokens") or DEFAULT_NEW_TOKENS)
    causal = resolve(str(params["model"]), params.get("head")).kind == "causal-lm"
    if params.get("task") == "generate" and new_tokens > 2 and causal:
        # The prefill, and the last decoded token (its KV cache is the largest): a
        # prefill of all but the last two tokens then one decoded token holds what the
        # last step of the whole generation holds, without tracing every step before it.
        seq_len = int(params.get("seq_len") or DEFAULT_SEQ_LEN)
        first = _phases({**params, "new_tokens": 1}, cuda)
        last = _phases({**params, "seq_len": seq_len + new_tokens - 2, "new_tokens": 2}, cuda)
        phases = {"prefill": first["prefill"], "decode": last["decode"]}
    else:
        phases = _phases(params, cuda)
    phase = max(phases, key=lambda name: sum(phases[name].values()))
    categories = dict(phases[phase])
    caveats = list(CAVEATS) if cuda else [CPU_CAVEAT]
    task = str(params.get("task", "train"))
    if cuda:
        workspace = CUBLAS_WORKSPACE * (2 if task == "train" else 1)
        categories[Category.TEMPORARIES] = categories.get(Category.TEMPORARIES, 0) + workspace
    total = sum(categories.values())
    return {
        "peak_allocated": total,
        "peak_reserved": rounded(total, SEGMENT) if cuda else total,
        "categories": {str(k): int(v) for k, v in categories.items()},
        "caveats": caveats,
        "phase": phase,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _phases(params: Mapping[str, Any], cuda: bool) -> dict[str, dict[str, int]]:
    """Each phase's peak by category: traced whole, or for a deep stack of identical
    blocks, traced at two shallow depths and extended."""
    depth = _depth(params)
    if depth is None:
        return _trace(params, cuda)
    key, layers = depth
    shallow = []
    for n in SHALLOW:
        config = {**(params.get("config") or {}), key: n}
        shallow.append(_trace({**params, "config": config}, cuda))
    return _extend(shallow, layers)


def _trace(params: Mapping[str, Any], cuda: bool) -> dict[str, dict[str, int]]:
    """Each phase's peak, by category, from the step traced on fake tensors."""
    semantics = CudaSemantics() if cuda else None
    with FakeTensorMode(allow_non_fake_inputs=True):
        built = build(params, torch.device("cpu"), initialize=False)
        if built.scaler is not None:
            built.scaler = FakeScaler(built.device)
        if semantics is not None:
            built.autocast_with = semantics.autocast
            semantics.checkpointing(built.model)
        _prime(built)
        return tally_step(built, BLOCK if cuda else 1, semantics).phases


def _depth(params: Mapping[str, Any]) -> tuple[str, int] | None:
    """The key and count of a deep model's repeated blocks (None: trace it whole)."""
    from workers.models.build import config_of

    _, config = config_of(params)
    keys = [k for k in LAYER_KEYS if isinstance(getattr(config, k, None), int)]
    if len(keys) != 1 or getattr(config, "num_decoder_layers", None) not in (
        None,
        getattr(config, keys[0]),
    ):
        return None
    layers = int(getattr(config, keys[0]))
    return (keys[0], layers) if layers >= DEEP_ENOUGH else None


def _extend(shallow: list[dict[str, dict[str, int]]], layers: int) -> dict[str, dict[str, int]]:
    """Each phase's categories at ``layers`` blocks, on the line through the two depths."""
    (a, b), (n_a, n_b) = shallow, SHALLOW
    out: dict[str, dict[str, int]] = {}
    for phase in a.keys() & b.keys():
        out[phase] = {
            k: max(0, a[phase][k] + (b[phase][k] - a[phase][k]) * (layers - n_a) // (n_b - n_a))
            for k in a[phase]
        }
    return out


def _prime(built: Built) -> None:
    """The state step 1 leaves: the optimizer's state made (by one step on zero
    gradients), gradients dropped again. Inference and generation keep nothing."""
    if built.optimizer is None:
        return
    for p in built.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    ident = request.get("id")
    try:
        params = request["params"]
        device = str(request.get("device") or "cuda")
        return {"id": ident, **predict(params, device)}
    except CatalogError as exc:
        return {"id": ident, "error": {"field": exc.field, "message": exc.message}}
    except Exception as exc:  # a model the tracer cannot follow: the spec is still fine
        return {
            "id": ident,
            "error": {
                "field": "params",
                "message": f"this model's step could not be predicted: {type(exc).__name__}: "
                f"{str(exc)[:500]}",
                "unpredictable": True,
            },
        }


def serve() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            continue
        sys.stdout.write(json.dumps(answer(request)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
