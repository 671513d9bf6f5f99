"""The QLoRA rule (workers/models/rules.py) against bitsandbytes itself, on the CPU.

bitsandbytes' 4-bit layers run on the CPU (its multi-backend build: the same
``MatMul4Bit`` autograd function, its ops' CPU kernels). This builds one QLoRA spec twice
on the CPU: as the worker builds it (transformers' BitsAndBytesConfig loading a saved
checkpoint, peft's prepare_model_for_kbit_training and LoRA: the real libraries), and as
the predictor does (the rule's stand-in, fake tensors). Each runs step 1, then step 2
under the category tally (each storage counted, no rounding), and each phase's peak is
printed side by side with what held it. Both sides attend with the CPU's kernels here:
CUDA's own choices (workers/models/cuda_semantics.py) are not in this comparison.

Needs bitsandbytes (not a project dependency: ``pip install bitsandbytes==0.50.2``):

    PYTHONPATH=. python -m bench.truth.qlora_cpu [--params '{"seq_len": 64}']
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

PARAMS: dict[str, Any] = {
    "model": "llama-1b",
    "config": {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 2048,
    },
    "precision": "bf16",
    "batch_size": 2,
    "seq_len": 128,
    "quantization": {"method": "nf4", "double_quant": True, "compute_dtype": "bf16"},
    "peft": {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
}


def phases(params: dict[str, Any], real: bool) -> dict[str, dict[str, int]]:
    from workers.models.build import build
    from workers.models.predict import _prime
    from workers.models.steps import run_step, tally_step

    cpu = torch.device("cpu")
    if real:
        built = build(params, cpu)
        run_step(built)  # step 1: the optimizer's state
        held_as_buffers(built.model)
    else:
        with FakeTensorMode(allow_non_fake_inputs=True):
            built = build(params, cpu, initialize=False)
            _prime(built)
            return tally_step(built, 1).phases
    return tally_step(built, 1).phases


def held_as_buffers(model: torch.nn.Module) -> None:
    """bitsandbytes' statistics of each 4-bit weight live on the weight's quant_state,
    neither a parameter nor a buffer: registered as buffers here so that the tally
    counts them (as the rule's stand-in holds its own)."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            nested = [state.state2.absmax, state.state2.code] if state.nested else []
            held = [state.absmax, state.code, state.offset, *nested]
            for i, t in enumerate(t for t in held if isinstance(t, torch.Tensor)):
                module.register_buffer(f"quant_state_{i}", t, persistent=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", default="{}", help="JSON merged over the default spec")
    args = parser.parse_args()
    params = {**PARAMS, **json.loads(args.params)}
    real, rule = phases(params, True), phases(params, False)
    print(f"{'phase':<10} {'category':<16} {'bitsandbytes':>14} {'rule':>14} {'ratio':>7}")
    for phase in ("forward", "backward", "optimizer"):
        a, b = real.get(phase, {}), rule.get(phase, {})
        for key in [*sorted(a.keys() | b.keys()), "peak"]:
            x = sum(a.values()) if key == "peak" else a.get(key, 0)
            y = sum(b.values()) if key == "peak" else b.get(key, 0)
            ratio = f"{y / x:.4f}" if x else "-"
            print(f"{phase:<10} {key:<16} {x:>14,} {y:>14,} {ratio:>7}")


if __name__ == "__main__":
    main()
