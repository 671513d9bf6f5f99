"""A model experiment's step in plain PyTorch, for checking vramlab's figures against it.

Nothing of vramlab's worker runs here: the model is built from the same config with
transformers, and a hand-written training loop (zero_grad with set_to_none, forward,
backward, optimizer step) runs two steps; step 2's peak is read from the allocator after
resetting its peak counters. Prints one JSON line: the peak and the bytes of parameters,
gradients and optimizer state (by storage). Run on a CUDA host:

    python -m bench.model_reference '{"model": "gpt2", "batch_size": 8, "seq_len": 1024}'
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(params: dict[str, Any]) -> dict[str, Any]:
    import transformers

    from vramlab.catalog.model_zoo import resolve  # the preset's config (plain data)

    resolved = resolve(params["model"])
    config = transformers.AutoConfig.for_model(
        resolved.model_type, **{**resolved.config, **params.get("config", {})}
    )
    if resolved.kind == "seq2seq-lm" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }[resolved.kind]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.get("precision", ""))
    device = torch.device("cuda:0")
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype or torch.float32, attn_implementation="sdpa")
    if params.get("dropout") is not None:  # as the spec's knob; else the config's own
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = float(params["dropout"])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = params.get("batch_size", 1), params.get("seq_len", 128)
    if resolved.kind == "image-classification":
        size = params.get("image_size") or getattr(config, "image_size", 224)
        pixels = torch.zeros(batch, 3, size, size, device=device, dtype=dtype or torch.float32)
        labels = torch.zeros(batch, dtype=torch.long, device=device)
        inputs = {"pixel_values": pixels, "labels": labels}
    else:
        ids = (torch.arange(batch * seq, device=device) % config.vocab_size).reshape(batch, seq)
        inputs = {"input_ids": ids, "labels": ids.clone()}
    peaks = []
    for _ in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        optimizer.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        del loss
        optimizer.step()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())

    def nbytes(tensors: list[torch.Tensor]) -> int:  # each storage once, in 512-byte blocks
        sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(-(-n // 512) * 512 for n in sizes.values())

    params_ = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "peak_step1": peaks[0],
        "peak_step2": peaks[1],
        "parameters": nbytes(params_),
        "gradients": nbytes([p.grad for p in params_ if p.grad is not None]),
        "optimizer_state": nbytes([v for v in state if v.is_cuda]),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
