"""Rewrite tests/api/openapi.json from the app (after a deliberate change to the API)."""

import json
import tempfile
from pathlib import Path

from app.main import create_app
from tests.conftest import make_settings


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(make_settings(f"sqlite:///{folder}/vramlab.db"))
        text = json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"
    Path(__file__).with_name("openapi.json").write_text(text)


if __name__ == "__main__":
    main()
