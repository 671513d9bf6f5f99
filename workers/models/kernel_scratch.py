"""What CUDA kernels allocate for themselves, made on fake tensors where the kernel runs.

Fake tensors make an op's outputs only. Some CUDA kernels also take buffers of their own
from the caching allocator and give them back before they return; when the step's peak
falls inside such a kernel, those bytes are part of it (as temporaries). Two are large
enough to move a training step's peak, measured op by op on an H200 (torch 2.11,
bench/kernel_scratch.py: the allocator's peak inside each op over what the op left):

- **Reductions over a dimension that is not the fastest** (``sum`` and ``mean`` over the
  rows of a matrix: the gradient of a linear layer's bias, of a norm's weight). PyTorch's
  reduction kernel (ATen's Reduce.cuh) splits a long reduction over several blocks per
  output and stages their partial results in a global buffer: ``sizeof(accumulator) x
  outputs x blocks per output x block width x outputs per thread``, and four bytes of
  semaphore per column of blocks. How many blocks depends on the GPU's multiprocessors:
  here an H100's or H200's 132, 2048 threads each. ViT-B's MLP bias at batch 64 (12,608 x
  3072 rows) takes 138,412,032 bytes; the model below gave that and every other shape
  measured to the byte.
- **cuDNN's attention backward** (what SDPA runs for half precision on Hopper with torch
  2.11, masks, dropout and grouped heads included): a float32 accumulator for the query's
  gradient (batch x heads x length x head size) and float32 row sums (batch x heads x
  length); with grouped key/value heads, the key's and value's gradients for every query
  head before they are summed back to their groups (in the inputs' dtype). Measured
  within 1 MiB over the 58 half-precision shapes of bench/kernel_scratch.py --sdpa-choice.

The memory-efficient kernel's backward (float32 attention) also keeps an accumulator, of
a size this model does not yet give exactly (within 2% on head sizes that are multiples
of 64); it is not made here.

A reduction's buffer is not linear in the batch (the blocks per output are capped by the
GPU's size), so where a prediction is reused across batch sizes (workers/models/
families.py) the buffer is not put on a line: its two counts are, and the buffer's bytes
are worked out again from them (``derived_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The GPUs the predictor answers for (H100 and H200): their multiprocessors and threads.
MULTIPROCESSORS = 132
THREADS_PER_MULTIPROCESSOR = 2048
WARP = 32
MAX_THREADS = 512  # a reduction block's threads (Reduce.cuh)
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
INPUT_VECTOR = 4


MiB = 2**20


def counted(nbytes: int) -> int:
    """The bytes the caching allocator counts for one buffer of ``nbytes`` that takes a
    fresh segment (or its own, freed by the same op before): from 10 MiB a segment is
    rounded up to 2 MiB, and what is left over is split off only past 1 MiB."""
    if nbytes < 10 * MiB:
        return nbytes
    whole = -(-nbytes // (2 * MiB)) * 2 * MiB
    return whole if whole - nbytes <= MiB else nbytes


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


@dataclass(frozen=True)
class Reduction:
    """One reduction's launch, less its two counts (outputs and inputs per output)."""

    fastest: bool  # the reduced dimension is the input's fastest-moving one
    accumulator: int  # bytes of the accumulator type
    output_vector: int  # outputs each thread handles (the non-fastest case)


def reduction_of(x: torch.Tensor, dims: list[int] | None) -> tuple[Reduction, int, int] | None:
    """How CUDA's reduction kernel lays out a reduction of ``x`` over ``dims`` (all where
    None or empty): the launch and its outputs and inputs per output, as ATen's
    TensorIterator orders and merges the dimensions (reduced first, then by stride)."""
    if not x.is_floating_point() or x.numel() == 0:
        return None
    accumulator = 8 if x.dtype == torch.float64 else 4
    ndim = x.dim()
    reduced = set(range(ndim)) if not dims else {d % max(ndim, 1) for d in dims}
    # Fastest first: the output's order (reduced dimensions first, its own strides, which
    # follow the logical order), then the input's strides among the reduced ones.
    order = [d for d in reversed(range(ndim)) if x.shape[d] != 1]
    kept = [d for d in order if d not in reduced]
    cut = sorted((d for d in order if d in reduced), key=lambda d: x.stride(d))
    shape: list[int] = []
    strides: list[int] = []
    groups: list[bool] = []
    for d in [*cut, *kept]:
        is_reduced = d in reduced
        if groups and groups[-1] == is_reduced and strides[-1] * shape[-1] == x.stride(d):
            shape[-1] *= x.shape[d]  # merged with the one before (contiguous in both)
            continue
        shape.append(x.shape[d])
        strides.append(x.stride(d))
        groups.append(is_reduced)
    n_reduced = sum(groups)
    outputs = 1
    for size, is_reduced in zip(shape, groups, strict=True):
        outputs *= 1 if is_reduced else size
    inputs = x.numel() // outputs
    if not shape:
        return Reduction(True, accumulator, 1), outputs, inputs
    fastest = n_reduced == len(shape) or strides[0] < strides[n_reduced]
    vector = 1
    moving = strides[0] if fastest else strides[n_reduced]
    if moving == 1 and not fastest:
        vector = 4
        for n in [x.storage_offset(), shape[n_reduced]] + [
            s for j, s in enumerate(strides) if j != n_reduced
        ]:
            while n % vector:
                vector //= 2
    return Reduction(fastest, accumulator, vector), outputs, inputs


def reduction_bytes(r: Reduction, outputs: int, inputs: int) -> tuple[int, int]:
    """The global buffer and semaphores CUDA's reduction kernel allocates (0, 0 where the
    reduction stays inside one block per output)."""
    if outputs <= 0 or inputs <= 0:
        return 0, 0
    dim0, dim1 = (inputs, outputs) if r.fastest else (outputs // r.output_vector, inputs)
    if r.fastest and dim0 > 128:
        dim0 //= INPUT_VECTOR
    limit = MAX_THREADS // r.output_vector
    dim0_pow2 = _last_pow2(dim0) if dim0 < limit else limit
    dim1_pow2 = _last_pow2(dim1) if dim1 < limit else limit
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, limit // width)
    width = min(dim0_pow2, limit // height)
    threads = width * height
    step_input = step_output = 1
    if r.fastest:
        step_input *= width
    else:
        step_output *= width
    values = _div_up(inputs, step_input)
    split_height = values >= min(height * MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD)
    if split_height:
        step_input *= height
    else:
        step_output *= height
    target = MULTIPROCESSORS * (THREADS_PER_MULTIPROCESSOR // threads)
    grid = _div_up(outputs // r.output_vector, step_output)
    values = _div_up(inputs, step_input)
    if not (split_height and values >= MAX_VALUES_PER_THREAD and grid <= target):
        return 0, 0
    ctas = max(
        min(_div_up(target, grid), _div_up(values, MIN_VALUES_PER_THREAD)),
        _div_up(values, MAX_VALUES_PER_THREAD),
    )
    if ctas <= 1:
        return 0, 0
    size = r.accumulator * outputs * ctas
    if not r.fastest:
        size *= width * r.output_vector
    return size, 4 * grid


def derived_bytes(recipe: tuple[Any, ...], outputs: int, inputs: int) -> int:
    """A derived birth's bytes again, from its recipe and its two counts."""
    reduction, which = recipe
    buffer, semaphores = reduction_bytes(reduction, outputs, inputs)
    return counted(buffer) if which == "buffer" else semaphores


_REDUCTIONS = {
    torch.ops.aten.sum.dim_IntList,
    torch.ops.aten.mean.dim,
    torch.ops.aten.sum.default,
    torch.ops.aten.mean.default,
}
_CUDNN_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default


def cudnn_backward_bytes(query: torch.Tensor, key: torch.Tensor) -> list[int]:
    """cuDNN's attention backward: the query gradient's float32 accumulator and float32 row
    sums; with grouped heads, the key's and value's gradients for every query head."""
    batch, heads, length, size = query.shape
    made = [4 * batch * heads * length * size, 4 * batch * heads * length]
    if key.shape[1] != heads:
        expanded = batch * heads * key.shape[2] * key.shape[3] * key.element_size()
        made += [expanded, expanded]
    return made


class KernelScratch(TorchDispatchMode):
    """Make, inside each op that has them, the buffers its CUDA kernel takes for itself,
    and give them back as it returns. Entered inside a category tally (it must be above
    the tally on the mode stack, so the tally sees them born and end); ``tally`` is told
    which births are derived (workers/models/tally.py)."""

    def __init__(self, tally: Any = None) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _REDUCTIONS:
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            self._reduction(args[0], list(dims) if dims is not None else None)
        elif func is _CUDNN_BACKWARD:
            query, key = args[1], args[2]
            made = cudnn_backward_bytes(query, key)
            held = [_scratch(counted(n), query.device) for n in made]
            del held
        return out

    def _reduction(self, x: torch.Tensor, dims: list[int] | None) -> None:
        if type(x) is not torch.Tensor and not _is_fake(x):
            return  # a DTensor and the like: its local ops come here on their own
        found = reduction_of(x, dims)
        if found is None:
            return
        reduction, outputs, inputs = found
        buffer, semaphores = reduction_bytes(reduction, outputs, inputs)
        # Made even where empty: a step's births are then the same at every batch size,
        # where the buffer itself comes and goes (workers/models/families.py).
        held = [_scratch(counted(buffer), x.device), _scratch(semaphores, x.device)]
        if self.tally is not None:
            for t, which in zip(held, ("buffer", "semaphores"), strict=True):
                self.tally.derive(t, (reduction, which), outputs, inputs)
        del held


def _is_fake(x: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)


def _scratch(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)
