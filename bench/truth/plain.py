"""One fine-tuning case as people write it, without any of vramlab's code: transformers,
peft, bitsandbytes, torchao and Liger as their documentation shows, two training steps, and the
allocator's figures. Run in a fresh process per case (bench/truth/run.py does):

    python bench/truth/plain.py '{"model_type": "llama", "kind": "causal-lm", "config": {...},
        "precision": "bf16", "batch_size": 4, "seq_len": 512, "peft": {"r": 8, ...}}'

Prints one JSON line: step 1's and step 2's peak allocated (``torch.cuda`` counters reset
before each step; for Trainer, at global step 2's start), and the bytes of parameters,
gradients and optimizer state on the device (each storage once, in 512-byte blocks), and
the paged optimizer state (managed memory) apart.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def model_of(case: dict[str, Any], device: torch.device) -> Any:
    import transformers

    config = transformers.AutoConfig.for_model(case["model_type"], **case["config"])
    if case.get("dropout") is not None:
        for key, value in vars(config).items():
            if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
                setattr(config, key, case["dropout"])
    if case["kind"] == "seq2seq-lm" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
    }[case["kind"]]
    dtype = DTYPES[case.get("precision", "fp32")]
    if case.get("liger"):
        # Liger's documented way: patch the architecture's classes before building.
        from liger_kernel.transformers import _apply_liger_kernel

        _apply_liger_kernel(
            case["model_type"],
            rope=False,
            rms_norm=False,
            swiglu=False,
            fused_linear_cross_entropy=True,
        )
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype, attn_implementation="sdpa")
    quant = case.get("quantization")
    if quant:
        # A checkpoint loaded quantized, as BitsAndBytesConfig's docs show.
        bnb = (
            transformers.BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=quant.get("double_quant", False),
                bnb_4bit_compute_dtype=DTYPES[quant.get("compute_dtype", "bf16")],
            )
            if quant["method"] == "nf4"
            else transformers.BitsAndBytesConfig(load_in_8bit=True)
        )
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            del model
            torch.cuda.empty_cache()
            model = auto.from_pretrained(
                folder, quantization_config=bnb, device_map={"": device}, dtype=dtype
            )
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if case.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = case.get("peft")
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora.get("dropout", 0.0),
                target_modules=lora.get("target_modules", "all-linear"),
                modules_to_save=lora.get("modules_to_save"),
            ),
        )
    model.train()
    return model, config


def inputs_of(case: dict[str, Any], config: Any, device: torch.device) -> dict[str, Any]:
    batch, seq = case["batch_size"], case["seq_len"]
    ids = (torch.arange(batch * seq, device=device) % config.vocab_size).reshape(batch, seq)
    target = case.get("target_len") or seq
    labels = (torch.arange(batch * target, device=device) % config.vocab_size).reshape(
        batch, target
    )
    return {"input_ids": ids, "labels": labels if case.get("target_len") else ids.clone()}


def optimizer_of(case: dict[str, Any], model: Any) -> torch.optim.Optimizer:
    weights = [p for p in model.parameters() if p.requires_grad]
    name = case.get("optimizer", "adamw")
    if name in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        import bitsandbytes as bnb

        cls = {
            "adamw-8bit": bnb.optim.AdamW8bit,
            "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
            "paged-adamw": bnb.optim.PagedAdamW,
        }[name]
        return cls(weights, lr=1e-4)
    if name.startswith("torchao-"):
        import torchao.optim  # torchao's docs: a drop-in replacement for torch.optim.AdamW

        cls = {
            "torchao-adamw-8bit": torchao.optim.AdamW8bit,
            "torchao-adamw-4bit": torchao.optim.AdamW4bit,
            "torchao-adamw-fp8": torchao.optim.AdamWFp8,
        }[name]
        return cls(weights, lr=1e-4)
    return torch.optim.AdamW(weights, lr=1e-4)


def held(value: torch.Tensor) -> list[torch.Tensor]:
    """What a state tensor holds: torchao's quantized moments by their codes, per-block
    scales and quantization map (a tensor subclass has no storage of its own)."""
    parts = [getattr(value, a) for a in ("codes", "scale", "qmap") if hasattr(value, a)]
    return parts or [value]


def nbytes(tensors: list[torch.Tensor]) -> int:
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    block = 512 if torch.cuda.is_available() else 1  # the CUDA caching allocator's rounding
    return sum(-(-n // block) * block for n in sizes.values())


def figures(model: Any, optimizer: Any, peaks: list[int]) -> dict[str, Any]:
    device = device_of()
    params = [p for p in model.parameters() if p.device == device]
    state = [
        t
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.device == device
        for t in held(v)
    ]
    return {
        "peak_step1": peaks[0],
        "peak_step2": peaks[1],
        "parameters": nbytes(params),
        "gradients": nbytes([p.grad for p in params if p.grad is not None]),
        "optimizer_state": nbytes([v for v in state if not getattr(v, "is_paged", False)]),
        "paged_optimizer_state": sum(
            v.untyped_storage().nbytes() for v in state if getattr(v, "is_paged", False)
        ),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def device_of() -> torch.device:
    """The GPU; the CPU only to smoke-test this script (its peaks are then 0)."""
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def sync_and_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak() -> int:
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def plain_loop(case: dict[str, Any]) -> dict[str, Any]:
    device = device_of()
    model, config = model_of(case, device)
    optimizer = optimizer_of(case, model)
    inputs = inputs_of(case, config, device)
    peaks = []
    for _ in range(2):
        sync_and_reset()
        optimizer.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        del loss
        optimizer.step()
        peaks.append(peak())
    return figures(model, optimizer, peaks)


def trainer_loop(case: dict[str, Any]) -> dict[str, Any]:
    """transformers' Trainer itself, with the case's TrainingArguments fields, stopped after
    global step 2; the peak of each global step read by a callback."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    device = device_of()
    model, config = model_of(case, device)
    args = case["trainer"]
    per_device = args.get("per_device_train_batch_size", 8)
    accumulation = args.get("gradient_accumulation_steps", 1)
    rows = inputs_of({**case, "batch_size": per_device * accumulation * 2}, config, device)
    samples = [
        {"input_ids": rows["input_ids"][i].cpu(), "labels": rows["labels"][i].cpu()}
        for i in range(rows["input_ids"].shape[0])
    ]
    peaks: list[int] = []
    grads: list[int] = []

    class Peaks(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            sync_and_reset()

        def on_optimizer_step(self, *a: Any, **k: Any) -> None:
            # Trainer frees the gradients after the step: count them here.
            params = [p for p in model.parameters() if p.grad is not None]
            grads.append(nbytes([p.grad for p in params]))

        def on_step_end(self, *a: Any, **k: Any) -> None:
            peaks.append(peak())

    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                output_dir=out,
                max_steps=2,
                report_to=[],
                save_strategy="no",
                logging_strategy="no",
                dataloader_pin_memory=False,
                remove_unused_columns=False,
                **args,
            ),
            train_dataset=samples,
            callbacks=[Peaks()],
        )
        trainer.train()
    return {**figures(trainer.model, trainer.optimizer, peaks), "gradients": grads[-1]}


if __name__ == "__main__":
    case = json.loads(sys.argv[1])
    result = trainer_loop(case) if case.get("trainer") else plain_loop(case)
    print(json.dumps(result))
