"""What tracing a model spec would cost, judged from its config before anything is built.

Tracing a step on fake tensors costs about the same per op whatever the tensors' sizes,
so its cost is the number of blocks built and run. A model's depth is read from every
config attribute that counts blocks (``n_layer``, ``num_hidden_layers``,
``encoder_layers``, ...), each counted once: transformers' ``attribute_map`` makes one
attribute answer to several names (GPT-2's ``num_hidden_layers`` is its ``n_layer``;
BART's is its ``encoder_layers``), so an alias is resolved to the attribute it stands for,
and that attribute is what a shallow trace overrides. Experts multiply the blocks.

The plan (``plan``): a model with no deep stack is traced whole; a deep one (one depth of
at least ``DEEP_ENOUGH`` for every stack, or stacks of different depths too many blocks to
trace whole) is traced at a few shallow depths and extended (workers/models/predict.py);
a spec whose trace would still be too costly (depths given as a list, too many stacks or
experts) and a config no model can have (negative sizes, sizes past any card) is refused
with a CatalogError that says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramlab.catalog.errors import CatalogError

# Attributes that count a model's repeated blocks (after aliases are resolved).
DEPTH_KEYS = (
    "n_layer",
    "n_layers",
    "num_layers",
    "num_hidden_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
)
# Attributes that count experts (each a block of its own in every layer that has them).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
DEEP_ENOUGH = 6  # a stack this deep or deeper is traced shallow and extended
MAX_WHOLE_BLOCKS = 24  # blocks (times experts) a whole trace may build
MAX_STACKS = 3  # distinct depths a shallow trace extends at once
# No int in a config may pass this (2**40: a width or a vocabulary past any card).
MAX_SIZE = 2**40
# A learned or computed position table (positions x width) past this many elements
# (16 GiB in fp32) is past any card; some models compute it on the host while building.
MAX_TABLE = 2**32
_WIDTH_KEYS = ("n_embd", "hidden_size", "d_model", "embed_dim", "dim")
_POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len")


@dataclass(frozen=True)
class Plan:
    """How a spec is traced: ``depths`` are the real depth attributes and their values;
    ``shallow``: traced shallow and extended (else whole); ``blocks``: what a whole trace
    builds (depth x experts)."""

    depths: dict[str, int]
    shallow: bool
    blocks: int

    @property
    def uniform(self) -> bool:
        """One depth for every stack (one key, or several at the same value)."""
        return len(set(self.depths.values())) == 1


def real_name(config: Any, key: str) -> str:
    """The attribute ``key`` stands for (itself, unless the config's attribute_map maps it)."""
    aliases = getattr(type(config), "attribute_map", None) or {}
    return str(aliases.get(key, key))


def depths_of(config: Any) -> dict[str, int]:
    """Each real depth attribute of ``config`` and its value (aliases counted once)."""
    out: dict[str, int] = {}
    for key in DEPTH_KEYS:
        name = real_name(config, key)
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out.setdefault(name, value)
    return out


def check_sizes(config: Any, overrides: Mapping[str, Any]) -> None:
    """Refuse a config no model can have: a negative size or depth, an int past any card,
    a position table past any card."""
    for key, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value < 0 and _is_size(key):
            raise CatalogError(f"params.config.{key}", f"must be >= 0, not {value}")
        if abs(value) > MAX_SIZE:
            raise CatalogError(f"params.config.{key}", f"{value} is past any model a card can hold")
    width = max((_int(config, k) for k in _WIDTH_KEYS), default=0)
    positions = max((_int(config, k) for k in _POSITION_KEYS), default=0)
    if width * positions > MAX_TABLE:
        raise CatalogError(
            "params.config",
            f"{positions} positions of width {width} make a table of "
            f"{width * positions} elements, past any card; make them smaller",
        )


def plan(config: Any, overrides: Mapping[str, Any]) -> Plan:
    """How to trace a model of ``config`` (CatalogError: it is not traced; why)."""
    check_sizes(config, overrides)
    depths = depths_of(config)
    for name, value in depths.items():
        if value < 0:
            raise CatalogError(f"params.config.{name}", f"must be >= 0, not {value}")
    experts = max((_int(config, k) for k in EXPERT_KEYS), default=0)
    listed = sum(
        sum(v)
        for k in ("depths", "layers_per_block")
        if isinstance(v := getattr(config, k, None), list | tuple)
        and all(isinstance(x, int) for x in v)
    )
    blocks = (sum(depths.values()) + listed) * max(1, experts)
    uniform = len(set(depths.values())) == 1
    deep = bool(depths) and (
        (uniform and min(depths.values()) >= DEEP_ENOUGH)
        or (not uniform and blocks > MAX_WHOLE_BLOCKS)
    )
    if deep and listed == 0 and len(depths) <= MAX_STACKS:
        if 3 * max(1, experts) > MAX_WHOLE_BLOCKS:
            raise _too_costly(depths, experts, blocks)
        return Plan(depths, True, blocks)
    if blocks > MAX_WHOLE_BLOCKS:
        raise _too_costly(depths, experts, blocks)
    return Plan(depths, False, blocks)


def _too_costly(depths: Mapping[str, int], experts: int, blocks: int) -> CatalogError:
    named = ", ".join(f"{k}={v}" for k, v in depths.items()) or "its depths"
    times = f" times {experts} experts" if experts > 1 else ""
    return CatalogError(
        "params.config",
        f"this model is too costly to predict: {named}{times} make {blocks} blocks to trace, "
        f"and the predictor traces at most {MAX_WHOLE_BLOCKS} (deep stacks of identical "
        f"blocks are extended from a shallow trace, but not this one); make it smaller",
    )


def _is_size(key: str) -> bool:
    return any(w in key for w in ("layer", "size", "dim", "head", "embd", "position", "expert"))


def _int(config: Any, key: str) -> int:
    value = getattr(config, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
