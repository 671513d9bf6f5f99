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
