"""Schemathesis against the live API's OpenAPI schema, on each database, with tokens on:
no response of 500 or more, and every response (status, content type, body) as the schema
documents it. One seeded pass of every phase (examples, coverage, fuzzing with 30 examples
an operation, stateful), the same cases each run: about 75 s an engine on 2 quiet cores.
VRAMLAB_SCHEMATHESIS_SECONDS=N instead keeps fuzzing new cases until N seconds are spent
(a --max-time run repeats fuzzing and stateful testing until its budget is gone)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_auth import create_token
from tests.conftest import LiveServer, make_settings

pytestmark = pytest.mark.slow
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    )
)


def _max_time() -> list[str]:
    seconds = os.environ.get("VRAMLAB_SCHEMATHESIS_SECONDS")
    return ["--max-time", seconds] if seconds else []


def test_schemathesis_finds_nothing(database_url: str, tmp_path: Path) -> None:
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    if st is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    admin = create_token(database_url, "admin")
    settings = make_settings(database_url, auth="on", claim_wait_seconds=0.2, diagnostic_ops=False)
    with LiveServer(settings) as live:
        args = [
            st,
            "run",
            f"{live.url}/openapi.json",
            "--checks",
            CHECKS,
            "--header",
            f"Authorization: Bearer {admin}",
            "--max-examples",
            os.environ.get("VRAMLAB_SCHEMATHESIS_EXAMPLES", "30"),
            *_max_time(),
            "--report",
            "ndjson",
            "--report-dir",
            str(tmp_path),
            "--seed",
            "1",
            "--request-timeout",
            "20",
        ]
        # A hang guard only: a loaded machine stretches the pass.
        done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:]
