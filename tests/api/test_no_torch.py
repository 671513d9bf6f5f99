"""The API never imports torch: its image has none and it must start fast."""

import subprocess
import sys


def test_the_api_and_the_worker_loop_import_no_torch() -> None:
    code = (
        "import sys; import app.main, app.cli, workers.loop, workers.runner; "
        "app.main.create_app(); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_worker_side_imports_no_web_stack() -> None:
    """`vramlab worker` (through app.cli or workers.cli) needs neither FastAPI, nor
    SQLAlchemy, nor uvicorn: a GPU host installs the worker's packages only."""
    code = (
        "import sys; import app.cli, workers.cli, workers.loop, workers.runner; "
        "app.cli.build_parser(); "
        "web = ('fastapi', 'starlette', 'sqlalchemy', 'uvicorn', 'alembic', 'torch'); "
        "print(sorted(m for m in web if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
