"""Write client/vramlab/catalog/model_types.json: the transformers ``model_type``s each Auto class
builds, by task kind, so that the API (which never imports transformers) can check a
model name and list what is known.

Run after changing the transformers range: ``python -m workers.models.types_gen``.
"""

import json
from pathlib import Path

from transformers import __version__
from transformers.models.auto import modeling_auto

OUT = Path(__file__).resolve().parents[2] / "client" / "vramlab" / "catalog" / "model_types.json"

MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}


def main() -> None:
    kinds = {kind: sorted(getattr(modeling_auto, name)) for kind, name in MAPPINGS.items()}
    OUT.write_text(json.dumps({"transformers": __version__, "kinds": kinds}, indent=1) + "\n")
    print(f"wrote {OUT.name}: " + ", ".join(f"{k} {len(v)}" for k, v in kinds.items()))


if __name__ == "__main__":
    main()
