"""A training program for the GPU tests of ``vramlab record``: ``python train_modes.py
MODE``, where MODE is one of ``MODES``. Two TransformerEncoderLayers (as in issue 21),
AdamW, two steps; it prints its parameters' bytes as the caching allocator counts them
(``params <n>``), its optimizer's state once trained (``state <n>``: none if a
GradScaler skipped every step), then ``trained``, then ends as MODE says.
"""

import os
import signal
import sys

import torch
from torch import nn

MODES = (
    "plain",
    "ckpt_reentrant",
    "ckpt_non_reentrant",
    "autocast",
    "scaler",
    "compile",
    "oom",
    "exit3",
    "sigterm",
)


class Encoder(nn.Module):
    def __init__(self, checkpoint: str) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.inp = nn.Linear(256, 256)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            if self.checkpoint:
                h = torch.utils.checkpoint.checkpoint(
                    layer, h, use_reentrant=self.checkpoint == "ckpt_reentrant"
                )
            else:
                h = layer(h)
        return h


def main(mode: str) -> int:
    torch.manual_seed(0)
    model = Encoder(mode if mode.startswith("ckpt") else "").cuda()
    params = sum((p.numel() * p.element_size() + 511) // 512 * 512 for p in model.parameters())
    print(f"params {params}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda") if mode == "scaler" else None
    forward = torch.compile(model) if mode == "compile" else model
    x = torch.randn(8, 128, 256, device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.float16, enabled=mode in ("autocast", "scaler")):
            loss = forward(x).float().square().mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    state = sum(
        (v.numel() * v.element_size() + 511) // 512 * 512
        for st in optimizer.state.values()
        for v in st.values()
        if torch.is_tensor(v) and v.is_cuda
    )
    print(f"state {state}", flush=True)
    print("trained", flush=True)
    if mode == "oom":
        torch.empty(2**50, dtype=torch.uint8, device="cuda")  # always more than the GPU has
    if mode == "exit3":
        return 3
    if mode == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
