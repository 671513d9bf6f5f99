"""The op catalog: torch-free data that the API and the worker both import.

An op is one entry here (its parameters, dtypes, devices and how to predict its bytes)
plus one small function in ``workers/ops.py`` that runs it with PyTorch.
"""

from app.catalog.entries import OPS, get_op, plan_spec
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.rounding import CUDA_BLOCK_ROUND, rounded_block_bytes
from vramlab.catalog.devices import DEVICE_TYPES, parse_device
from vramlab.catalog.dtypes import DTYPES, FLOATING_DTYPES, itemsize

__all__ = [
    "CUDA_BLOCK_ROUND",
    "DEVICE_TYPES",
    "DTYPES",
    "FLOATING_DTYPES",
    "OPS",
    "CatalogError",
    "OpEntry",
    "Param",
    "TensorPlan",
    "TensorSpec",
    "get_op",
    "itemsize",
    "parse_device",
    "plan_spec",
    "rounded_block_bytes",
]
