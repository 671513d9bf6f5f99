"""Stand-ins on fake tensors for what has no fake-tensor implementation: bitsandbytes'
8-bit and paged AdamW and its 4-bit (NF4) and 8-bit (LLM.int8) linear layers, torchao's
low-bit AdamW, torch's Adafactor (whose update reads values), and Liger's fused linear
cross-entropy. Each makes the tensors its library makes, of the same sizes and lifetimes,
as documented below; the rest of the step is traced as it runs. The worker runs the real
libraries; bench/truth/ checks these rules against them on a GPU host.

- AdamW8bit (bitsandbytes' Optimizer2State.init_state): per parameter of at least
  4096 elements, two uint8 moments (2 bytes per element) and two float32 absmax per
  block of ``BNB_OPTIM_BLOCK`` elements; smaller parameters keep two float32 moments; two
  256-entry float32 quantization maps per optimizer. The update is one in-place kernel.
- Paged (``is_paged``): each moment of at least 100,000 elements lives in CUDA managed
  memory (``cudaMallocManaged``): the caching allocator does not count it, and the driver
  pages it to the host when the GPU runs short. It is reported apart, never in the peak.
- torchao's AdamW8bit, AdamW4bit and AdamWFp8 (torchao.optim 0.18, ``_AdamBase._new_buffer``
  and the ``OptimState*.zeros`` of subclass_8bit/4bit/fp8.py): per parameter a float32
  ``step`` scalar (on the host: ``torch.tensor(0.0)``) and two moments. A parameter of at
  least 4096 elements whose count divides by the block (256 for 8-bit and FP8, 128 for
  4-bit) keeps each moment as codes (uint8 one per element; 4-bit: uint8 one per two
  elements; FP8: float8_e4m3fn one per element), a float32 scale per block and, for 8- and
  4-bit, its own float32 quantization map (256 and 16 entries; FP8 has none); any other
  parameter keeps two plain moments in its own dtype. Each group's lr is a float32 scalar.
  The update is a torch.compile'd function per parameter (fake tensors cannot compile).
  For a quantized parameter its kernels hold, while that parameter is updated, buffers
  of the parameter's element count: both moments dequantized in float32 (4 bytes an
  element each) and, for 4-bit, the codes before packing (int64 on CUDA, 8 bytes an
  element each; on the CPU a byte more each); FP8's hold one byte an element per moment;
  with two float32 scales per block and, on CUDA, 179,712 bytes more. So the update's
  peak is at the largest parameter: 8.03 bytes an element for 8-bit, 24.06 (CUDA) or
  26.06 (CPU) for 4-bit and 2.03 for FP8, as measured on an H200 (torch 2.11) and on the
  CPU (torch 2.13) with torchao 0.18.
- NF4 (Linear4bit): the weight packed two per byte; an absmax per 64 elements (float32,
  or with double quantisation uint8 plus a float32 per 256 of them, a 256-entry code and
  a float32 offset); a 16-entry code per layer. Forward and backward each dequantize the
  whole weight in the compute dtype for the matmul and free it (with double quantisation,
  the absmax first, in float32); ``MatMul4Bit`` saves only the packed weight.
- LLM.int8 (Linear8bitLt): int8 weight and a float32 scale per output row; the forward
  quantizes its input to int8 (with float32 row scales) and multiplies into int32; the
  backward dequantizes the weight in the compute dtype.
- Liger's fused linear cross-entropy: no logits of the whole batch. The input's gradient
  (and the head's, if trained) is made in the forward, chunk by chunk: ``chunk x vocab``
  logits at a time, chunk = the next power of two of tokens / ceil(vocab / hidden).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BNB_OPTIM_BLOCK = 2048  # bitsandbytes' blockwise optimizer state: one absmax per block
BNB_MIN_8BIT = 4096
BNB_PAGED_MIN = 100_000
NF4_BLOCK = 64
NF4_DOUBLE_BLOCK = 256


class StateRule(torch.optim.Optimizer):
    """An optimizer whose kernels fake tensors cannot run, as its state's bytes: the first
    step makes each trained parameter's state (``make_state``); each step's update of a
    parameter holds what ``update`` makes (in place: nothing more, unless a rule says)."""

    # The device whose kernels the rules stand for (the predictor's fake tensors are the
    # CPU's whichever device it predicts for).
    device_type = "cpu"

    def make_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def update(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        """What the update holds beyond the state while it runs (default: nothing)."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.make_state(p, self.state[p])
                self.update(p, self.state[p])


class BnbAdamWRule(StateRule):
    """bitsandbytes' AdamW (8- or 32-bit state, paged or not) as its bytes."""

    def __init__(self, params: Iterable[torch.Tensor], bits: int, paged: bool) -> None:
        super().__init__(params, {"lr": 1e-4})
        self.bits, self.paged = bits, paged
        self.paged_bytes = 0
        self._qmaps: list[torch.Tensor] = []

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        if self.paged and p.numel() >= BNB_PAGED_MIN:
            self.paged_bytes += p.numel() * dtype.itemsize
            return None  # managed memory: not the allocator's
        return torch.zeros_like(p, dtype=dtype)

    def make_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        eight = self.bits == 8 and p.numel() >= BNB_MIN_8BIT
        dtype = torch.uint8 if eight else torch.float32
        for name in ("state1", "state2"):
            buffer = self._buffer(p, dtype)
            if buffer is not None:
                state[name] = buffer
        if eight:
            if not self._qmaps:
                self._qmaps = [torch.zeros(256, device=p.device) for _ in range(2)]
            state["qmap1"], state["qmap2"] = self._qmaps
            blocks = math.ceil(p.numel() / BNB_OPTIM_BLOCK)
            state["absmax1"] = torch.zeros(blocks, device=p.device)
            state["absmax2"] = torch.zeros(blocks, device=p.device)


# torchao.optim's blocks (its defaults) and what a moment's codes hold per element.
TORCHAO_BLOCK = {"torchao-adamw-8bit": 256, "torchao-adamw-4bit": 128, "torchao-adamw-fp8": 256}
TORCHAO_MIN_QUANTIZED = 4096
TORCHAO_QMAP = {"torchao-adamw-8bit": 256, "torchao-adamw-4bit": 16, "torchao-adamw-fp8": 0}
# The compiled update's buffers for a quantized parameter, in bytes per element (one
# buffer each); where the CPU's kernels differ, theirs; and what CUDA's kernels hold
# beside them per update.
TORCHAO_UPDATE = {
    "torchao-adamw-8bit": (4, 4),
    "torchao-adamw-4bit": (4, 4, 8, 8),
    "torchao-adamw-fp8": (1, 1),
}
TORCHAO_UPDATE_CPU = {"torchao-adamw-4bit": (4, 4, 9, 9)}
TORCHAO_UPDATE_CUDA_EXTRA = 179_712


class TorchaoAdamWRule(StateRule):
    """torchao's low-bit AdamW as its state's bytes (see the module's docstring)."""

    def __init__(self, params: Iterable[torch.Tensor], name: str) -> None:
        super().__init__(params, {"lr": 1e-4})
        self.name = name
        for group in self.param_groups:  # torchao keeps each group's lr as a tensor
            group["lr"] = torch.tensor(group["lr"], dtype=torch.float32)

    def _moment(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        block, n = TORCHAO_BLOCK[self.name], p.numel()
        if n < TORCHAO_MIN_QUANTIZED or n % block:
            return {"": torch.zeros_like(p)}
        if self.name == "torchao-adamw-4bit":
            codes = torch.zeros(n // 2, dtype=torch.uint8, device=p.device)
        elif self.name == "torchao-adamw-fp8":
            codes = torch.zeros(p.shape, dtype=torch.float8_e4m3fn, device=p.device)
        else:
            codes = torch.zeros(p.shape, dtype=torch.uint8, device=p.device)
        out = {".codes": codes, ".scale": torch.zeros(n // block, device=p.device)}
        if TORCHAO_QMAP[self.name]:
            out[".qmap"] = torch.zeros(TORCHAO_QMAP[self.name], device=p.device)
        return out

    def make_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = torch.tensor(0.0)
        for name in ("exp_avg", "exp_avg_sq"):
            for part, t in self._moment(p).items():
                state[name + part] = t

    def update(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        """The compiled update's buffers for one parameter, made and freed as it runs."""
        if "exp_avg.codes" not in state:
            return  # a plain moment: its update's buffers are small (not predicted)
        n, cuda = p.numel(), self.device_type == "cuda"
        sizes = TORCHAO_UPDATE[self.name]
        if not cuda:
            sizes = TORCHAO_UPDATE_CPU.get(self.name, sizes)
        held = [torch.empty(n * size, dtype=torch.uint8, device=p.device) for size in sizes]
        held += [torch.empty(n // TORCHAO_BLOCK[self.name], device=p.device) for _ in range(2)]
        if cuda:
            held.append(torch.empty(TORCHAO_UPDATE_CUDA_EXTRA, dtype=torch.uint8, device=p.device))
        del held


class _ScalarsAsOne(TorchDispatchMode):
    """Reads of a tensor's value (``.item()``) answered with one: fake tensors hold no
    values, and what an optimizer reads so only scales its update."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


class FakeAdafactor(torch.optim.Adafactor):
    """torch's Adafactor on fake tensors: its own state and update, traced as they run,
    with the scalars it reads (the step count, the norms of a parameter and its update)
    answered as one. Its bytes do not depend on those values."""

    def step(self, closure: Any = None) -> Any:
        with _ScalarsAsOne():
            return super().step(closure)


# -- quantized linear layers ---------------------------------------------------------------


class _Dequantized(torch.autograd.Function):
    """y = x W^T with W dequantized for the matmul (and again for the input's gradient).
    With double quantisation the block absmax is dequantized first, in float32: in the
    forward (bitsandbytes' dequantize-then-matmul path on CUDA) it and its offset sum
    live through the matmul; in the backward it lives until the weight is made."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_features: int, dtype: torch.dtype, blocks: int
    ) -> torch.Tensor:
        ctx.shape, ctx.dtype, ctx.blocks = (out_features, x.shape[-1]), dtype, blocks
        absmax = [torch.empty(blocks, device=x.device) for _ in range(2 if blocks else 0)]
        weight = torch.empty(ctx.shape, dtype=dtype, device=x.device)
        out = x @ weight.t()
        del absmax, weight
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        absmax = torch.empty(ctx.blocks, device=grad.device) if ctx.blocks else None
        weight = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad.device)
        del absmax
        return grad @ weight, None, None, None


class _Int8(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_features: int, dtype: torch.dtype) -> torch.Tensor:
        ctx.shape, ctx.dtype = (out_features, x.shape[-1]), dtype
        rows = x.reshape(-1, x.shape[-1])
        quantized = torch.empty_like(rows, dtype=torch.int8)
        scales = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        product = torch.empty(rows.shape[0], out_features, dtype=torch.int32, device=x.device)
        del quantized, scales
        out = product.to(dtype).reshape(*x.shape[:-1], out_features)
        del product
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        weight = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad.device)
        return grad @ weight, None, None


class QuantizedLinear(torch.nn.Linear):
    """A linear layer whose weight is stored as bitsandbytes stores it (frozen)."""

    def __init__(self, linear: torch.nn.Module, method: str, double: bool, dtype: torch.dtype):
        torch.nn.Module.__init__(self)
        weight: torch.Tensor = getattr(linear, "weight")  # noqa: B009 (a Module's attribute)
        bias: torch.Tensor | None = getattr(linear, "bias", None)
        if isinstance(linear, torch.nn.Linear):
            self.in_features, self.out_features = linear.in_features, linear.out_features
        else:  # transformers' Conv1D (GPT-2): its weight is (in, out), transposed to quantize
            self.in_features, self.out_features = int(weight.shape[0]), int(weight.shape[1])
        self.method, self.compute_dtype = method, dtype
        n, device = weight.numel(), weight.device
        # The absmax blocks dequantized around each matmul (double quantisation only).
        self.nested_blocks = math.ceil(n / NF4_BLOCK) if method == "nf4" and double else 0
        if method == "nf4":
            packed = torch.empty(math.ceil(n / 2), 1, dtype=torch.uint8, device=device)
            blocks = math.ceil(n / NF4_BLOCK)
            if double:
                stats = [
                    torch.empty(blocks, dtype=torch.uint8, device=device),
                    torch.empty(math.ceil(blocks / NF4_DOUBLE_BLOCK), device=device),
                    torch.empty(256, device=device),  # the absmax's code, a copy per layer
                    torch.empty((), device=device),  # the absmax's offset (their mean)
                ]
            else:
                stats = [torch.empty(blocks, device=device)]
            stats.append(torch.empty(16, device=device))  # the NF4 code
        else:
            shape = (self.out_features, self.in_features)
            packed = torch.empty(shape, dtype=torch.int8, device=device)
            stats = [torch.empty(self.out_features, device=device)]
        self.weight = torch.nn.Parameter(packed, requires_grad=False)
        for i, stat in enumerate(stats):
            self.register_buffer(f"quant_state_{i}", stat)
        if bias is not None:
            bias.requires_grad_(False)
        self.register_parameter("bias", cast("torch.nn.Parameter | None", bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x.to(self.compute_dtype)
        if self.method == "nf4":
            out = _Dequantized.apply(inp, self.out_features, self.compute_dtype, self.nested_blocks)
        else:
            out = _Int8.apply(inp, self.out_features, self.compute_dtype)
        if self.bias is not None:
            out = out + self.bias.to(self.compute_dtype)
        return out.to(x.dtype)


def quantize(model: torch.nn.Module, method: str, double: bool, dtype: torch.dtype) -> None:
    """Every linear layer (and Conv1D) but the output head quantized (as transformers'
    bitsandbytes integration leaves the head), the rest frozen and, as peft's
    prepare_model_for_kbit_training does, cast to float32."""
    from transformers.pytorch_utils import Conv1D

    lm: Any = model
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            # Conv1D too (GPT-2's linear layers): transformers' integration quantizes them.
            if isinstance(child, torch.nn.Linear | Conv1D) and child is not head:
                setattr(parent, name, QuantizedLinear(child, method, double, dtype))
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            continue
        for param in module.parameters(recurse=False):
            param.requires_grad_(False)
            if param.dtype in (torch.float16, torch.bfloat16):
                param.data = param.data.to(torch.float32)  # tied weights stay tied


# -- Liger's fused linear cross-entropy -------------------------------------------------


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        tokens, width = hidden.shape
        vocab = weight.shape[0]
        chunk = 1 << max(0, math.ceil(math.log2(math.ceil(tokens / math.ceil(vocab / width)))))
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_input = torch.zeros_like(hidden)
        losses = torch.zeros(tokens, dtype=torch.float32, device=hidden.device)
        for start in range(0, tokens, chunk):
            part = hidden[start : start + chunk]
            logits = part @ weight.t()  # its gradient is written over it, in place
            grad_input[start : start + chunk] = logits @ weight
            if grad_weight is not None:
                torch.addmm(grad_weight, logits.t(), part, out=grad_weight)
            del logits
        loss = losses.sum() / tokens
        del losses
        ctx.save_for_backward(grad_input, *(() if grad_weight is None else (grad_weight,)))
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        return saved[0], saved[1] if len(saved) > 1 else None


def liger_forward(model: Any) -> Any:
    """The causal LM's forward as Liger's patch makes it (the loss fused with the head)."""
    base, head = model.get_decoder(), model.get_output_embeddings()

    def forward(input_ids: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> Any:
        hidden = base(input_ids=input_ids, **kwargs).last_hidden_state
        padded = torch.nn.functional.pad(labels, (0, 1), value=-100)
        shifted = padded[..., 1:].contiguous()
        del padded, shifted  # the kernel reads them; no tensor of the step's size
        flat = hidden.reshape(-1, hidden.shape[-1])
        return SimpleNamespace(loss=_FusedLinearCrossEntropy.apply(flat, head.weight))

    return forward
