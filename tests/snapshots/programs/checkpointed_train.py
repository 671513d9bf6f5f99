"""A training loop that runs fine on its own: two transformer layers under non-reentrant
activation checkpointing, AdamW, two steps (the case that breaks under allocation
history with stacks at frees)."""

import torch
from torch.utils.checkpoint import checkpoint

layers = torch.nn.ModuleList(
    torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True) for _ in range(2)
).cuda()
optimizer = torch.optim.AdamW(layers.parameters())
x = torch.randn(8, 128, 256, device="cuda")
for _ in range(2):
    h = x
    for layer in layers:
        h = checkpoint(layer, h, use_reentrant=False)
    h.square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("trained")
