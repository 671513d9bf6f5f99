"""A model wrapped for several GPUs of one host: DDP or FSDP2, as their docs show.

The same wrapping serves the worker's ranks (a real process group: NCCL on CUDA, gloo on
the CPU) and the predictor (PyTorch's fake process group, on fake tensors): each rank's
step is the one step of workers/models/steps.py on its own model. FSDP2 (``fully_shard``)
shards each repeated block, then the root, as torchtitan does; ``hybrid`` is a 2-D mesh
(2 replicas, each sharding over half the GPUs), ``grad-op`` keeps the gathered parameters
from the forward to the backward (``reshard_after_forward=False``), ``mixed_precision``
computes in bf16 over fp32 shards and ``offload_optimizer`` keeps the shards, their
gradients and the optimizer's state in host memory (``CPUOffloadPolicy``: the optimizer
steps on the CPU).

DDP keeps its gradient buckets (``bucket_cap_mb``, 25 MB; the first 1 MB) beside the
gradients; no tensor the step can reach holds them. The predictor's fake reducer hands
them to its communication hook (step 1 runs in full for that), which keeps them for the
tally of the step after; the worker reads their sizes from the reducer's layout
(``buckets``) and its categories count them as gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from vramlab.runspec import Distributed

BUCKET_CAP_MB = 25  # DDP's default bucket_cap_mb


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (every ModuleList of one class of module with
    parameters), outermost first: each is one FSDP unit."""
    found: list[torch.nn.Module] = []
    for module in model.modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) > 0
            and len({type(m) for m in module}) == 1
            and any(True for _ in module.parameters())
        ):
            found.extend(module)
    return found


def mesh(plan: Distributed, device_type: str) -> Any:
    """The device mesh FSDP shards over: 1-D, or 2-D (replicate, shard) for hybrid."""
    from torch.distributed.device_mesh import init_device_mesh

    if plan.sharding == "hybrid":
        shape = (2, plan.gpus // 2)
        return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (plan.gpus,))


def wrap(built: Any, plan: Distributed, fake: bool = False) -> None:
    """Wrap ``built.model`` for ``plan`` in place (its optimizer is then made again, over
    what the wrapper trains). ``fake``: on fake tensors under the fake process group."""
    if plan.strategy == "ddp":
        built.model = ddp(built.model, built.device, fake)
        if fake:  # the reducer's buckets, once a step has handed them to the hook
            built.held = built.model.seen_buckets
    else:
        fsdp(built.model, plan, built.device.type, fake)


def ddp(model: torch.nn.Module, device: torch.device, fake: bool) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    if not fake:
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=BUCKET_CAP_MB)
    # Fake tensors hold no values: nothing to check or broadcast across ranks, and a
    # bucket's all-reduce (in place, on the bucket) is its buffer handed back.
    with mock.patch.object(dist, "_verify_params_across_processes", lambda *a: None):
        wrapped = DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=BUCKET_CAP_MB, init_sync=False
        )
    # Each bucket handed to the hook is kept (once): a step's tally then holds the
    # reducer's own buckets from its start. (A lambda: DDP checks a hook's annotations,
    # which this module's are strings.)
    seen: list[torch.Tensor] = []
    setattr(wrapped, "seen_buckets", seen)  # noqa: B010 (a module's attribute, untyped)
    wrapped.register_comm_hook(seen, lambda seen, bucket: _done(_keep(seen, bucket.buffer())))
    wrapped.reducer = _NoRebuild(wrapped.reducer)  # type: ignore[assignment]
    return wrapped


def _keep(seen: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
    key = buffer.untyped_storage()._cdata
    if all(b.untyped_storage()._cdata != key for b in seen):
        seen.append(buffer)
    return buffer


def _done(buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


class _NoRebuild:
    """DDP's reducer on fake tensors: buckets are not rebuilt in the order gradients came
    (that needs the ranks to agree by a broadcast of values); their total is the same."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def buckets(model: torch.nn.Module) -> list[torch.Tensor]:
    """Tensors the size of each of DDP's gradient buckets, as its reducer laid them out
    (new zeros: on fake tensors, the stand-ins the predictor's tally holds)."""
    reducer = getattr(model, "reducer", None)
    if reducer is None:
        return []
    return [bucket.buffer() for bucket in reducer._get_zeros_like_grad_buckets()]


def fsdp(model: torch.nn.Module, plan: Distributed, device_type: str, fake: bool) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    with _real_tensors(fake):
        on = mesh(plan, device_type)
    options: dict[str, Any] = {"mesh": on}
    if plan.sharding == "grad-op":
        options["reshard_after_forward"] = False
    if plan.mixed_precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if plan.offload_optimizer:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)


@contextlib.contextmanager
def _real_tensors(fake: bool) -> Iterator[None]:
    """The mesh's rank map is real data (a fake tensor has no values to list)."""
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds); any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


@contextlib.contextmanager
def fake_group(plan: Distributed | None) -> Iterator[None]:
    """Rank 0 of a fake process group of ``plan.gpus`` ranks (PyTorch's: collectives do
    nothing), for the predictor: the ranks of DDP and FSDP on equal batches are alike."""
    if plan is None:
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.gpus)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def storage_watched(tally: Any) -> Iterator[None]:
    """Tell ``tally`` (workers/models/tally.py) when FSDP2 frees and re-gathers its
    unsharded parameters: it resizes their storages in place (``resize_``), which no
    dispatch mode sees and which ends no storage's life."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:  # another layout of FSDP2's private modules: nothing to tell
        yield
        return
    if not hasattr(_fsdp_param_group, "alloc_storage"):
        yield
        return
    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_watched(tensor: torch.Tensor) -> None:
        alloc(tensor)
        tally.resized(tensor, "parameters")

    def free_watched(tensor: torch.Tensor) -> None:
        free(tensor)
        tally.resized(tensor)

    with (
        mock.patch.object(_fsdp_param, "alloc_storage", alloc_watched),
        mock.patch.object(_fsdp_param, "free_storage", free_watched),
        mock.patch.object(_fsdp_param_group, "alloc_storage", alloc_watched),
    ):
        yield
