"""Diagnostic ops: sleep (timeouts, cancels) and abort (crashes)."""

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


OPS = {
    "sleep": Op(no_inputs, _sleep_run, probe=False),
    "abort": Op(no_inputs, _abort_run, probe=False),
}
