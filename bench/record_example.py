"""A small training loop to record: ``vramlab record -- python bench/record_example.py``.

Three Linear layers, Adam, a few steps on random data; ``--oom`` asks for far more than
any GPU has at the end, to show the OOM dump.
"""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--oom", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, 10),
    ).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width, device="cuda")
        y = torch.randint(0, 10, (args.batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if args.oom:
        torch.empty(2**50, dtype=torch.uint8, device="cuda")  # a petabyte: always OOM


if __name__ == "__main__":
    main()
