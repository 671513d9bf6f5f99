"""Who may do what: bearer tokens with scopes, stored hashed; open only on loopback."""

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.core.config import normalise_database_url
from tests.conftest import LiveServer, free_port, make_settings
from tests.e2e.procs import env_for, start, stop, wait_done, wait_ready
from tests.helpers import ADD, CPU_CAPS


def create_token(database_url: str, *scopes: str) -> str:
    """`vramlab token create`, as an operator runs it: the token is printed once."""
    args = [sys.executable, "-m", "app.cli", "token", "create", "--name", "t"]
    for scope in scopes:
        args += ["--scope", scope]
    env = {**os.environ, "VRAMLAB_DATABASE_URL": database_url}
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    token = done.stdout.strip()
    assert token.startswith("vl_") and "shown once" in done.stderr
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_loopback_without_tokens_runs_open(client: httpx.Client) -> None:
    assert client.post("/v1/experiments", json=ADD).status_code == 202
    assert client.get("/v1/experiments").status_code == 200


def test_scopes_decide_what_a_token_may_do(database_url: str) -> None:
    reader = create_token(database_url, "read")
    submitter = create_token(database_url, "submit")
    worker = create_token(database_url, "worker")
    admin = create_token(database_url, "admin")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        anonymous = c.get("/v1/experiments")
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["type"] == "unauthorized"
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/experiments", headers=bearer("vl_forged")).status_code == 401

        assert c.get("/v1/experiments", headers=bearer(reader)).status_code == 200
        denied = c.post("/v1/experiments", json=ADD, headers=bearer(reader))
        assert denied.status_code == 403 and "'submit'" in denied.json()["error"]["message"]

        made = c.post("/v1/experiments", json=ADD, headers=bearer(submitter))
        assert made.status_code == 202
        assert made.json()["submitted_by"] is not None
        register = {"name": "w", "capabilities": CPU_CAPS}
        assert (
            c.post("/v1/worker/register", json=register, headers=bearer(submitter)).status_code
            == 403
        )
        assert c.post("/v1/experiments", json=ADD, headers=bearer(worker)).status_code == 403
        assert (
            c.post("/v1/worker/register", json=register, headers=bearer(worker)).status_code == 200
        )

        for path in ("/v1/experiments", "/v1/workers", "/v1/catalog"):
            assert c.get(path, headers=bearer(admin)).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes need no token


def test_tokens_are_stored_hashed_and_can_be_revoked(database_url: str) -> None:
    token = create_token(database_url, "read")
    engine = create_engine(normalise_database_url(database_url))
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT id, token_hash FROM api_tokens")).one()
    engine.dispose()
    assert stored.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored.token_hash
    env = {**os.environ, "VRAMLAB_DATABASE_URL": database_url}
    subprocess.run(
        [sys.executable, "-m", "app.cli", "token", "revoke", stored.id], env=env, check=True
    )
    with LiveServer(make_settings(database_url, auth="on")) as live:
        assert httpx.get(f"{live.url}/v1/experiments", headers=bearer(token)).status_code == 401


def test_listening_beyond_loopback_requires_tokens(database_url: str) -> None:
    with LiveServer(make_settings(database_url, host="0.0.0.0")) as live:
        response = httpx.get(f"{live.url}/v1/experiments")
        assert response.status_code == 401


def test_the_shared_worker_token_only_works_the_protocol(database_url: str) -> None:
    with LiveServer(make_settings(database_url, worker_token="w0rker")) as live:
        with httpx.Client(base_url=live.url, headers=bearer("w0rker")) as c:
            register = {"name": "w", "capabilities": CPU_CAPS}
            assert c.post("/v1/worker/register", json=register).status_code == 200
            assert c.post("/v1/experiments", json=ADD).status_code == 403


def test_swagger_authorize_knows_bearer_tokens(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    assert schema["paths"]["/v1/experiments"]["post"]["security"]


@pytest.mark.parametrize("scope", ["bogus"])
def test_unknown_scope_is_refused_by_the_cli(database_url: str, scope: str) -> None:
    env = {**os.environ, "VRAMLAB_DATABASE_URL": database_url}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "token", "create", "--scope", scope],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_web_pages_sign_in_with_a_token_cookie(database_url: str) -> None:
    reader = create_token(database_url, "read")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        for page in ("/ui/", "/ui"):  # the address typed without its slash too
            bounced = c.get(page)
            assert bounced.status_code == 303 and bounced.headers["location"] == "/ui/signin"
        assert c.get("/ui/signin").status_code == 200
        wrong = c.post("/ui/signin", data={"token": "vl_nope"})
        assert wrong.status_code == 401 and "unknown or revoked" in wrong.text
        signed = c.post("/ui/signin", data={"token": reader})
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert c.get("/ui/").status_code == 200  # the client keeps the cookie
        assert c.get("/ui", follow_redirects=True).url.path == "/ui/"
        assert c.get("/v1/experiments").status_code == 200
        same_site = {"Origin": live.url}
        denied = c.post("/v1/experiments", json=ADD, headers=same_site)
        assert denied.status_code == 403 and "'submit'" in denied.text  # still only `read`
        c.post("/ui/signout")
        assert c.get("/ui/").status_code == 303


def _served_on_every_address(
    command: str, database_url: str, tmp_path: Path, *extra: str
) -> Iterator[str]:
    """A real `vramlab <command> --host 0.0.0.0`, reached over 127.0.0.1; killed by PID."""
    port = free_port()
    log = tmp_path / f"{command}.log"
    # Whatever the environment says, the address really bound decides.
    env = env_for(database_url, VRAMLAB_HOST="127.0.0.1", VRAMLAB_CLAIM_WAIT_SECONDS="2")
    proc = start([command, "--host", "0.0.0.0", "--port", str(port), *extra], env, log)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
    assert "OPEN" not in log.read_text()


def test_serve_on_every_address_requires_tokens(database_url: str, tmp_path: Path) -> None:
    for url in _served_on_every_address("serve", database_url, tmp_path):
        with httpx.Client(base_url=url) as c:
            listed = c.get("/v1/experiments")
            assert listed.status_code == 401, listed.text
            register = {"name": "w", "capabilities": CPU_CAPS}
            assert c.post("/v1/worker/register", json=register).status_code == 401
            assert c.post("/v1/experiments", json=ADD).status_code == 401
            assert c.get("/healthz").status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_up_on_every_address_requires_tokens_and_its_worker_has_one(
    database_url: str, tmp_path: Path
) -> None:
    admin = create_token(database_url, "admin")
    for url in _served_on_every_address("up", database_url, tmp_path, "--device", "cpu"):
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.get("/v1/experiments").status_code == 401
            made = c.post("/v1/experiments", json=ADD, headers=bearer(admin))
            assert made.status_code == 202
            exp = wait_done(httpx.Client(base_url=url, headers=bearer(admin)), made.json()["id"])
            assert exp["status"] == "succeeded", exp


def test_priority_above_the_ceiling_needs_admin(database_url: str) -> None:
    submitter = create_token(database_url, "submit")
    admin = create_token(database_url, "admin")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        jump = c.post("/v1/experiments", json={**ADD, "priority": 100}, headers=bearer(submitter))
        assert jump.status_code == 403, jump.text
        assert "admin" in jump.json()["error"]["message"]
        sweep = {"spec": {**ADD, "priority": 1}, "grid": {"shape": [[8], [16]]}}
        assert c.post("/v1/sweeps", json=sweep, headers=bearer(submitter)).status_code == 403
        preset = {"priority": 5, "device": "cpu", "size": "small"}
        run = c.post(
            "/v1/presets/cpu_copy_stays_alive/runs", json=preset, headers=bearer(submitter)
        )
        assert run.status_code == 403, run.text
        for priority in (0, -50):
            lower = {**ADD, "priority": priority}
            assert c.post("/v1/experiments", json=lower, headers=bearer(submitter)).is_success
        high = c.post("/v1/experiments", json={**ADD, "priority": 100}, headers=bearer(admin))
        assert high.status_code == 202
    with LiveServer(make_settings(database_url, max_priority=10)) as live:
        with httpx.Client(base_url=live.url, headers=bearer(submitter)) as c:
            assert c.post("/v1/experiments", json={**ADD, "priority": 10}).status_code == 202
            assert c.post("/v1/experiments", json={**ADD, "priority": 11}).status_code == 403


def test_metrics_can_require_a_token(database_url: str) -> None:
    reader = create_token(database_url, "read")
    with LiveServer(make_settings(database_url)) as live:
        assert httpx.get(f"{live.url}/metrics").status_code == 200  # the default: open
    with LiveServer(make_settings(database_url, metrics_need_token=True)) as live:
        anonymous = httpx.get(f"{live.url}/metrics")
        assert anonymous.status_code == 401
        scraped = httpx.get(f"{live.url}/metrics", headers=bearer(reader))
        assert scraped.status_code == 200 and "vramlab_experiments" in scraped.text


def test_a_malformed_submit_without_a_token_is_refused_before_it_is_read(
    database_url: str,
) -> None:
    """Authentication comes first: a stranger learns of no field errors."""
    token = create_token(database_url, "submit")
    with LiveServer(make_settings(database_url, auth="on")) as live:
        url = f"{live.url}/v1/experiments"
        for body in ({"op": 3, "shape": "x"}, {"nonsense": True}, []):
            response = httpx.post(url, json=body)
            assert response.status_code == 401, response.text
            assert response.json()["error"]["type"] == "unauthorized"
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert httpx.post(url, content=b"{not json", headers=bearer("nope")).status_code == 401
        # With a token, the same body gets its field errors.
        response = httpx.post(url, json={"op": 3, "shape": "x"}, headers=bearer(token))
        assert response.status_code == 422
        assert {"op", "shape"} <= {d["field"] for d in response.json()["error"]["details"]}
