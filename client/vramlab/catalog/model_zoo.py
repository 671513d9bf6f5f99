"""Models a model experiment can build: named presets holding well-known shapes, and
every ``model_type`` that transformers' Auto classes build for the four task kinds.

Torch- and transformers-free: the API checks names here, the worker builds from the same
entries (workers/models/build.py). Weights are never downloaded: a preset is a config
with random weights, and a hub checkpoint's name maps to the preset with its shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from vramlab.runspec import HEADS, Head

# The task kinds (a model spec's ``head``), declared with the run spec.
Kind = Head
KINDS: tuple[Kind, ...] = HEADS
# A model_type that several Auto classes build gets the first kind here that has it
# (BERT is a masked LM first, BART and T5 are seq2seq first); ``params.head`` overrides.
KIND_PREFERENCE: tuple[Kind, ...] = ("seq2seq-lm", "masked-lm", "causal-lm", "image-classification")

_TYPES_FILE = Path(__file__).with_name("model_types.json")


@dataclass(frozen=True)
class Preset:
    name: str
    model_type: str
    kind: Kind
    about: str
    config: dict[str, Any] = field(default_factory=dict)


_LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("gpt2", "gpt2", "causal-lm", "GPT-2 small: 12 layers, 768 wide, 124M parameters"),
        Preset(
            "gpt2-medium",
            "gpt2",
            "causal-lm",
            "GPT-2 medium: 24 layers, 1024 wide, 355M parameters",
            {"n_layer": 24, "n_embd": 1024, "n_head": 16},
        ),
        Preset(
            "gpt2-large",
            "gpt2",
            "causal-lm",
            "GPT-2 large: 36 layers, 1280 wide, 774M parameters",
            {"n_layer": 36, "n_embd": 1280, "n_head": 20},
        ),
        Preset("bert-base", "bert", "masked-lm", "BERT base: 12 layers, 768 wide, 110M"),
        Preset(
            "bert-large",
            "bert",
            "masked-lm",
            "BERT large: 24 layers, 1024 wide, 335M",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
            },
        ),
        Preset(
            "t5-small",
            "t5",
            "seq2seq-lm",
            "T5 small: 6+6 layers, 512 wide, 60M",
            {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "d_kv": 64},
        ),
        Preset(
            "t5-base",
            "t5",
            "seq2seq-lm",
            "T5 base: 12+12 layers, 768 wide, 220M",
            {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12, "d_kv": 64},
        ),
        Preset(
            "llama-1b",
            "llama",
            "causal-lm",
            "Llama 3.2 1B's shape: 16 layers, 2048 wide",
            _LLAMA_1B,
        ),
        Preset(
            "llama-3b",
            "llama",
            "causal-lm",
            "Llama 3.2 3B's shape: 28 layers, 3072 wide",
            {**_LLAMA_1B, "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24},
        ),
        Preset(
            "llama-8b",
            "llama",
            "causal-lm",
            "Llama 3.1 8B's shape: 32 layers, 4096 wide, untied embeddings",
            {
                **_LLAMA_1B,
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "tie_word_embeddings": False,
            },
        ),
        Preset(
            "mistral-7b",
            "mistral",
            "causal-lm",
            "Mistral 7B's shape: 32 layers, 4096 wide, 8 KV heads",
            {
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "sliding_window": None,
            },
        ),
        Preset("vit-base", "vit", "image-classification", "ViT-B/16 at 224: 12 layers, 86M"),
        Preset(
            "resnet-50",
            "resnet",
            "image-classification",
            "ResNet-50: bottleneck blocks 3-4-6-3, 25.6M",
            {
                "layer_type": "bottleneck",
                "depths": [3, 4, 6, 3],
                "hidden_sizes": [256, 512, 1024, 2048],
                "embedding_size": 64,
                "num_labels": 1000,
            },
        ),
        # Tiny shapes of the same architectures: seconds on a CPU (tests, first tries).
        Preset(
            "tiny-gpt2",
            "gpt2",
            "causal-lm",
            "GPT-2 with 2 layers, 64 wide, a 1000-token vocabulary",
            {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 256},
        ),
        Preset(
            "tiny-llama",
            "llama",
            "causal-lm",
            "Llama with 2 layers, 64 wide, 2 KV heads",
            {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 256,
            },
        ),
        Preset(
            "tiny-bert",
            "bert",
            "masked-lm",
            "BERT with 2 layers, 64 wide",
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 1000,
                "max_position_embeddings": 256,
            },
        ),
        Preset(
            "tiny-t5",
            "t5",
            "seq2seq-lm",
            "T5 with 2+2 layers, 64 wide",
            {
                "d_model": 64,
                "d_ff": 128,
                "num_layers": 2,
                "num_heads": 4,
                "d_kv": 16,
                "vocab_size": 1000,
            },
        ),
        Preset(
            "tiny-vit",
            "vit",
            "image-classification",
            "ViT with 2 layers, 64 wide, 32-pixel images",
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "image_size": 32,
                "patch_size": 8,
                "num_labels": 10,
            },
        ),
        Preset(
            "tiny-resnet",
            "resnet",
            "image-classification",
            "ResNet with two small stages",
            {
                "layer_type": "basic",
                "depths": [1, 1],
                "hidden_sizes": [16, 32],
                "embedding_size": 16,
                "num_labels": 10,
            },
        ),
    )
}

# Hub checkpoints people name, and the preset with their shape (weights never come).
HUB_NAMES: dict[str, str] = {
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-large": "gpt2-large",
    "gpt2-medium": "gpt2-medium",
    "gpt2-large": "gpt2-large",
    "google-bert/bert-base-uncased": "bert-base",
    "bert-base-uncased": "bert-base",
    "bert-base-cased": "bert-base",
    "google-bert/bert-large-uncased": "bert-large",
    "bert-large-uncased": "bert-large",
    "google-t5/t5-small": "t5-small",
    "google-t5/t5-base": "t5-base",
    "t5-base": "t5-base",
    "meta-llama/Llama-3.2-1B": "llama-1b",
    "meta-llama/Llama-3.2-3B": "llama-3b",
    "meta-llama/Llama-3.1-8B": "llama-8b",
    "meta-llama/Meta-Llama-3-8B": "llama-8b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "mistralai/Mistral-7B-v0.3": "mistral-7b",
    "google/vit-base-patch16-224": "vit-base",
    "microsoft/resnet-50": "resnet-50",
}


@cache
def model_types() -> dict[Kind, tuple[str, ...]]:
    """Each task kind's model_types, as transformers' Auto classes know them."""
    data = json.loads(_TYPES_FILE.read_text())
    return {kind: tuple(data["kinds"][kind]) for kind in KINDS}


def kinds_of(model_type: str) -> tuple[Kind, ...]:
    """The task kinds a model_type is built for, preferred first."""
    types = model_types()
    return tuple(k for k in KIND_PREFERENCE if model_type in types[k])


@dataclass(frozen=True)
class Resolved:
    """A model name resolved: its preset (if any), model_type, task kind and base config."""

    name: str
    model_type: str
    kind: Kind
    config: dict[str, Any]
    preset: str | None


class UnknownModel(ValueError):
    pass


# A config.json's architecture names end in the Auto class's head.
_ARCHITECTURE_KINDS: tuple[tuple[str, Kind], ...] = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForConditionalGeneration", "seq2seq-lm"),
    ("ForSeq2SeqLM", "seq2seq-lm"),
    ("ForImageClassification", "image-classification"),
)
# What a config.json holds that the build skips (written by transformers, harmless here).
CONFIG_JSON_SKIPPED = (
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_name_or_path",
    "_attn_implementation_autoset",
)


def resolve_spec(
    name: str | None, head: str | None = None, config_json: dict[str, Any] | None = None
) -> Resolved:
    """A spec's model: ``name`` resolved, or a whole config.json (its model_type, and its
    architectures' head unless ``head`` names one); ``name`` then only labels it."""
    if config_json is None:
        if name is None:
            raise UnknownModel("give a model (a preset or a model_type) or a config_json")
        return resolve(name, head)
    model_type = str(config_json.get("model_type"))
    kinds = kinds_of(model_type)
    if not kinds:
        raise UnknownModel(
            f"config_json's model_type {model_type!r} is not one transformers' Auto classes "
            f"build here (GET /v1/catalog/models lists them)"
        )
    if head is None:
        for arch in config_json.get("architectures") or []:
            found = [k for suffix, k in _ARCHITECTURE_KINDS if str(arch).endswith(suffix)]
            if found and found[0] in kinds:
                head = found[0]
                break
    kind: Kind = kinds[0]
    if head is not None:
        if head not in kinds:
            raise UnknownModel(
                f"transformers builds {model_type!r} as {', '.join(kinds)}, not {head}"
            )
        kind = head
    config = {k: v for k, v in config_json.items() if k not in CONFIG_JSON_SKIPPED}
    return Resolved(name or f"{model_type} (config.json)", model_type, kind, config, None)


def resolve(name: str, head: str | None = None) -> Resolved:
    """A preset name, a hub checkpoint's name (its preset), or a transformers model_type."""
    preset = PRESETS.get(HUB_NAMES.get(name, name))
    if preset is not None:
        if head is not None and head != preset.kind:
            raise UnknownModel(f"preset {preset.name!r} is a {preset.kind} model, not {head}")
        return Resolved(
            preset.name, preset.model_type, preset.kind, dict(preset.config), preset.name
        )
    kinds = kinds_of(name)
    if kinds:
        if head is not None:
            if head not in kinds:
                raise UnknownModel(
                    f"transformers builds {name!r} as {', '.join(kinds)}, not as {head}"
                )
            return Resolved(name, name, head, {}, None)
        return Resolved(name, name, kinds[0], {}, None)
    if "/" in name:
        raise UnknownModel(
            f"{name!r} looks like a hub checkpoint; weights are never downloaded here: pass its "
            f"config.json (config_json, `vramlab plan --config ./config.json`), or use a preset "
            f"({', '.join(PRESETS)}) or a model_type with config overrides"
        )
    raise UnknownModel(
        f"unknown model {name!r}: use a preset ({', '.join(PRESETS)}) or a transformers "
        f"model_type (GET /v1/catalog/models lists them)"
    )
