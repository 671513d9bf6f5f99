"""One training case across the GPUs of one host as people write it, without any of
vramlab's code: N ranks spawned by this script (no torchrun), each joining an NCCL
process group on its own GPU, the model wrapped as torch's docs show (DDP, or FSDP2's
``fully_shard`` on each decoder layer and then the model), two training steps, and each
rank's allocator figures. bench/truth/run.py runs it in a fresh process per case:

    python bench/truth/plain_distributed.py '{"model_type": "gpt2", "kind": "causal-lm",
        "config": {...}, "batch_size": 8, "seq_len": 512,
        "distributed": {"strategy": "ddp", "gpus": 2}}'

``--cpu`` runs the same on the CPU with gloo (a smoke test: the CPU has no allocator
counters, so its peaks are 0). Prints one JSON line: ``{"ranks": [...]}``, each rank with
step 1's and step 2's peak allocated (``torch.cuda`` counters reset before each step) and
the bytes of its parameters, gradients and optimizer state on its device (a sharded
tensor's local shard; each storage once, in 512-byte blocks).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors: list[torch.Tensor], cuda: bool) -> int:
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    block = 512 if cuda else 1
    return sum(-(-n // block) * block for n in sizes.values())


def layers(model: Any) -> list[Any]:
    """The decoder layers, as the FSDP2 examples shard them (Llama's model.layers,
    GPT-2's transformer.h)."""
    for path in ("model.layers", "transformer.h", "model.decoder.layers"):
        found: Any = model
        for part in path.split("."):
            found = getattr(found, part, None)
        if found is not None:
            return list(found)
    raise ValueError("no decoder layers found to shard")


def rank_main(rank: int, case: dict[str, Any], cpu: bool, folder: str) -> None:
    import transformers

    plan = case["distributed"]
    world = plan["gpus"]
    device = torch.device("cpu") if cpu else torch.device("cuda", rank)
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "gloo" if cpu else "nccl",
        init_method=f"file://{folder}/store",
        rank=rank,
        world_size=world,
    )
    config = transformers.AutoConfig.for_model(case["model_type"], **case["config"])
    auto = {"causal-lm": transformers.AutoModelForCausalLM}[case["kind"]]
    with torch.device(device):
        model = auto.from_config(
            config, dtype=DTYPES[case.get("precision", "fp32")], attn_implementation="sdpa"
        )
    if case.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if plan["strategy"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=None if cpu else [rank])
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        if plan.get("sharding") == "hybrid":
            mesh = init_device_mesh(
                device.type, (2, world // 2), mesh_dim_names=("replicate", "shard")
            )
        else:
            mesh = init_device_mesh(device.type, (world,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if plan.get("sharding") == "grad-op":
            kwargs["reshard_after_forward"] = False
        if plan.get("mixed_precision") == "bf16":
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            )
        if plan.get("offload_optimizer"):
            kwargs["offload_policy"] = CPUOffloadPolicy()
        for layer in layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = case["batch_size"], case["seq_len"]  # per GPU
    ids = (torch.arange(batch * seq, device=device) % config.vocab_size).reshape(batch, seq)
    labels = ids.clone()
    peaks = []
    for _ in range(2):
        if not cpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        del loss
        optimizer.step()
        if not cpu:
            torch.cuda.synchronize()
        peaks.append(0 if cpu else int(torch.cuda.max_memory_allocated()))
    params = [local(p) for p in model.parameters()]
    params = [p for p in params if p.device == device]
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    state = [
        local(v)
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and local(v).device == device
    ]
    out = {
        "rank": rank,
        "peak_step1": peaks[0],
        "peak_step2": peaks[1],
        "parameters": nbytes(params, not cpu),
        "gradients": nbytes([g for g in grads if g.device == device], not cpu),
        "optimizer_state": nbytes(state, not cpu),
    }
    with open(f"{folder}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    cpu = "--cpu" in sys.argv[1:]
    case = json.loads(args[0])
    world = case["distributed"]["gpus"]
    if not cpu and torch.cuda.device_count() < world:
        raise SystemExit(f"needs {world} GPUs; this host has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(rank_main, args=(case, cpu, folder), nprocs=world, join=True)
        ranks = []
        for r in range(world):
            with open(f"{folder}/rank{r}.json") as f:
                ranks.append(json.load(f))
    print(json.dumps({"ranks": ranks}))


if __name__ == "__main__":
    main()
