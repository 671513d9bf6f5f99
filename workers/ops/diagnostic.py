"""Diagnostic ops: sleep (timeouts, cancels), abort (crashes) and leak (a process left
holding memory)."""

import os
import time

import torch

from workers.ops.base import Inputs, Op, OpContext, Outputs, no_inputs


def _sleep_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    held = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    return held


def _abort_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    # A real crash (SIGABRT), not an exception: the runner must survive it.
    os.abort()


# What ``leak`` keeps: alive for as long as the process lives.
_LEAKED: list[torch.Tensor] = []


def _leak_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    held = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
    _LEAKED.append(held)
    return held


OPS = {
    "sleep": Op(no_inputs, _sleep_run, probe=False),
    "abort": Op(no_inputs, _abort_run, probe=False),
    "leak": Op(no_inputs, _leak_run, probe=False),
}
