"""The spec's CUDA caching-allocator settings as PYTORCH_CUDA_ALLOC_CONF. Torch-free.

Most settings are read when CUDA's allocator first starts, so a forked child may set
them. The backend is fixed when torch loads: a spec that changes it needs a fresh
interpreter, with the variable set before torch is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def conf_string(settings: Mapping[str, Any]) -> str:
    parts = []
    for key, value in settings.items():
        if isinstance(value, bool):
            value = "True" if value else "False"
        parts.append(f"{key}:{value}")
    return ",".join(parts)


def set_env(conf: str) -> None:
    if conf:
        for name in CONF_VARS:
            os.environ[name] = conf


def current_conf() -> str:
    return os.environ.get(CONF_VARS[0]) or os.environ.get(CONF_VARS[1]) or ""


def backend_of(conf: str) -> str:
    for part in conf.split(","):
        key, _, value = part.partition(":")
        if key.strip() == "backend":
            return value.strip()
    return "native"


def needs_fresh_interpreter(settings: Mapping[str, Any]) -> bool:
    """True when the spec asks for another backend than the one torch loaded with here."""
    wanted = settings.get("backend")
    return wanted is not None and wanted != backend_of(current_conf())


# Settings the caching allocator reads when it makes, splits or frees a block, not when it
# starts: a warm spare whose CUDA context exists takes them through
# torch.cuda.memory._set_allocator_settings before its first allocation (checked on an
# H200: an expandable segment maps, docs/gpu-measurements.md). Anything else, the backend
# above all, takes the cold path: a child forked for the spec.
RUNTIME_KEYS = frozenset(
    {
        "expandable_segments",
        "max_split_size_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
    }
)


def warm_safe(settings: Mapping[str, Any]) -> bool:
    """Whether a child whose CUDA context already exists can still honour ``settings``."""
    return all(
        key in RUNTIME_KEYS or (key == "backend" and not needs_fresh_interpreter(settings))
        for key, value in settings.items()
        if value is not None
    )
