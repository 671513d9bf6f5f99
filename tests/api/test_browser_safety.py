"""What a browser on another site cannot make this service do: reach the open service
by DNS rebinding, sign someone in or change state with their cookie, frame the pages, or
run a script the page did not send. And what the sign-in cookie holds: a session, never
the token."""

import gzip
import re
import subprocess
import sys
from datetime import timedelta

import httpx
import pytest

from app.access import sessions
from app.tables import ApiToken
from app.tables.base import utcnow
from tests.api.test_auth import bearer, create_token
from tests.conftest import LiveServer, make_settings
from tests.e2e.procs import env_for
from tests.helpers import ADD, MATMUL
from tests.results.trace_data import events, upload
from tests.snapshots.synthetic import dumps, training_snapshot

FOREIGN = "https://attacker.example"


def test_the_open_service_answers_only_loopback_host_names(database_url: str) -> None:
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        rebound = {"Host": f"attacker.example:{live.port}"}
        assert c.get("/v1/experiments", headers=rebound).status_code == 403
        submitted = c.post("/v1/experiments", json=ADD, headers=rebound)
        assert submitted.status_code == 403
        assert "VRAMLAB_OPEN_HOSTS" in submitted.json()["error"]["message"]
        assert c.get("/ui/", headers=rebound).status_code == 403
        assert c.get("/v1/experiments").json()["items"] == []
        for host in ("localhost", "127.0.0.1", "[::1]", "vramlab.localhost"):
            assert c.get("/v1/experiments", headers={"Host": f"{host}:{live.port}"}).is_success
    with LiveServer(make_settings(database_url, open_hosts=["vramlab.lan"])) as live:
        with httpx.Client(base_url=live.url) as c:
            assert c.get("/v1/experiments", headers={"Host": "vramlab.lan"}).is_success
            assert c.get("/v1/experiments").status_code == 403  # 127.0.0.1 is not listed


def test_the_open_service_refuses_changes_from_other_sites(client: httpx.Client) -> None:
    exp = client.post("/v1/experiments", json=ADD).json()
    cancel = f"/v1/experiments/{exp['id']}/cancel"
    for headers in ({"Origin": FOREIGN}, {"Referer": f"{FOREIGN}/x"}, {"Origin": "null"}):
        assert client.post(cancel, headers=headers).status_code == 403, headers
    assert client.post("/v1/experiments", json=ADD, headers={"Origin": FOREIGN}).status_code == 403
    assert client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "queued"
    assert client.post(cancel).status_code == 200  # a program: no Origin at all


def _sign_in(c: httpx.Client, token: str) -> httpx.Response:
    return c.post("/ui/signin", data={"token": token}, headers={"Origin": str(c.base_url)})


def test_cookie_changes_must_come_from_this_site(database_url: str) -> None:
    user = create_token(database_url, "read", "submit")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        # Login CSRF: another site's form cannot sign the browser in with its token.
        for headers in ({"Origin": FOREIGN}, {"Sec-Fetch-Site": "cross-site"}):
            forged = c.post("/ui/signin", data={"token": user}, headers=headers)
            assert forged.status_code == 403 and "set-cookie" not in forged.headers
        assert _sign_in(c, user).status_code == 303
        exp = c.post("/v1/experiments", json=ADD, headers=bearer(user)).json()
        cancel = f"/v1/experiments/{exp['id']}/cancel"
        for headers in (
            {"Origin": FOREIGN},
            {"Origin": "http://127.0.0.1:1"},  # another port is another origin
            {"Sec-Fetch-Site": "same-site", "Origin": "https://sub.127.0.0.1"},
            {},  # the cookie alone: a browser sends Origin with a change; this did not
        ):
            refused = c.post(cancel, headers=headers)
            assert refused.status_code == 403, (headers, refused.text)
        assert c.get(f"/v1/experiments/{exp['id']}").json()["status"] == "queued"
        same = c.post(cancel, headers={"Origin": live.url, "Sec-Fetch-Site": "same-origin"})
        assert same.status_code == 200
        assert c.get(f"/v1/experiments/{exp['id']}").json()["status"] == "cancelled"
        again = c.post("/v1/experiments", json=ADD, headers={"Referer": f"{live.url}/ui/submit"})
        assert again.status_code == 202


def test_the_cookie_holds_a_revocable_session_not_the_token(database_url: str) -> None:
    user = create_token(database_url, "read")
    settings = make_settings(database_url, session_seconds=3600, auth="on")
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as c:
        signed = _sign_in(c, user)
        header = signed.headers["set-cookie"]
        value = c.cookies["vramlab_session"]
        assert user not in header and user[3:] not in value
        assert "max-age=3600" in header.lower() and "secure" not in header.lower()
        assert c.get("/ui/").status_code == 200

        # Forged or stale sessions are refused.
        token_id, _, signature = value.split(".")
        with live.app.state.db.session() as s:
            row = s.get(ApiToken, token_id)
            assert row is not None
            stale = sessions.issue(
                live.app.state.session_key, row, utcnow() - timedelta(hours=2), 3600
            )
        later = str(int(utcnow().timestamp()) + 10**6)
        for bad in (stale, f"{token_id}.{later}.{signature}", user, "x.1.2"):
            with httpx.Client(base_url=live.url, cookies={"vramlab_session": bad}) as other:
                bounced = other.get("/ui/")
                assert bounced.status_code == 303, bad
                assert other.get("/v1/experiments").status_code == 401

        # Revoking the token ends its sessions at once.
        env = env_for(database_url)
        subprocess.run(
            [sys.executable, "-m", "app.cli", "token", "revoke", token_id], env=env, check=True
        )
        assert c.get("/ui/").status_code == 303
        assert c.get("/v1/experiments").status_code == 401


def test_the_cookie_is_secure_beyond_loopback(database_url: str) -> None:
    user = create_token(database_url, "read")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        host = {"Host": "vramlab.example.org", "Origin": "https://vramlab.example.org"}
        signed = c.post("/ui/signin", data={"token": user}, headers=host)
        assert signed.status_code == 303
        assert "secure" in signed.headers["set-cookie"].lower()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_pages_send_a_policy_and_nonce_every_script(client: httpx.Client) -> None:
    client.post("/v1/experiments", json=ADD)
    nonces = set()
    for path in ("/ui/", "/ui/submit", "/ui/signin", "/ui/compare", "/ui/plan"):
        page = client.get(path)
        assert page.status_code == 200, path
        policy = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
        assert "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";")[0]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        nonce = re.search(r"'nonce-([^']+)'", policy)
        assert nonce is not None
        nonces.add(nonce.group(1))
        scripts = re.findall(r"<script([^>]*)>", page.text)
        assert scripts, path
        for attrs in scripts:
            if 'type="application/json"' not in attrs:
                assert f'nonce="{nonce.group(1)}"' in attrs, (path, attrs)
        assert " onclick=" not in page.text and " onload=" not in page.text
    assert len(nonces) == 5  # a fresh nonce per response


def _documents(client: httpx.Client) -> dict[str, str]:
    """A URL of each document this service serves: every operation of the OpenAPI
    document that answers HTML (and its SVG), the pages, their error pages, /docs."""
    exp_id = upload(client, MATMUL, [events()])
    sweep = client.post("/v1/sweeps", json={"spec": ADD, "grid": {"shape": [[8, 8]]}}).json()
    snapshot = client.post(
        "/v1/snapshots",
        content=gzip.compress(dumps(training_snapshot(iterations=1, layers=2))),
        headers={"Content-Type": "application/octet-stream"},
    ).json()
    ids = {
        "experiment_id": exp_id,
        "sweep_id": sweep["id"],
        "snapshot_id": snapshot["id"],
        # A fit needs the model predictor; its plot is the same chart page as the others.
        "fit_id": None,
    }
    urls: dict[str, str] = {}
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        for method, op in operations.items():
            if "text/html" not in op["responses"].get("200", {}).get("content", {}):
                continue
            assert method == "get", path
            named = re.findall(r"{(\w+)}", path)
            if any(ids[n] is None for n in named):
                continue
            url = path.format(**{n: ids[n] for n in named})
            if path.startswith("/v1/compare"):
                url += f"?ids={exp_id}&"
            else:
                url += "?"
            urls[path] = url + "format=html"
            urls[path + " svg"] = url + "format=svg"
    # The timelines of an experiment, a snapshot and a comparison, a sweep's plot.
    assert len(urls) == 2 * 4, sorted(urls)
    urls |= {
        "docs": "/docs",
        "list": "/ui/",
        "experiment": f"/ui/experiments/{exp_id}",
        "sweep": f"/ui/sweeps/{sweep['id']}",
        "snapshot": f"/ui/snapshots/{snapshot['id']}",
        "compare": f"/ui/compare?ids={exp_id}",
        "submit": "/ui/submit",
        "presets": "/ui/presets",
        "sign-in": "/ui/signin",
        "a page's 404": "/ui/experiments/nope",
        "a page's 422": "/ui/?status=bogus",
        "a page's 405": f"/ui/experiments/{exp_id}/cancel",
    }
    return urls


def test_every_document_carries_the_policy_and_every_script_its_nonce(
    client: httpx.Client,
) -> None:
    seen: dict[str, int] = {}
    for what, url in _documents(client).items():
        response = client.get(url)
        media = response.headers["content-type"].split(";")[0]
        assert media in ("text/html", "image/svg+xml"), (what, media)
        seen[what] = response.status_code
        policy = response.headers.get("content-security-policy")
        assert policy is not None, (what, url, response.status_code)
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, what
        scripts_may = policy.split("script-src", 1)[1].split(";")[0]
        assert "'unsafe-inline'" not in scripts_may and "'unsafe-eval'" not in scripts_may
        assert response.headers["x-frame-options"] == "DENY", what
        assert response.headers["x-content-type-options"] == "nosniff", what
        nonce = re.search(r"'nonce-([^']+)'", policy)
        assert nonce is not None, what
        for attrs in re.findall(r"<script([^>]*)>", response.text):
            if 'type="application/json"' not in attrs:
                assert f'nonce="{nonce.group(1)}"' in attrs, (what, attrs)
    assert [seen[k] for k in ("a page's 404", "a page's 422", "a page's 405")] == [404, 422, 405]
    assert seen["docs"] == seen["list"] == seen["/v1/experiments/{experiment_id}/timeline"] == 200
    # A JSON answer is not a document: no policy to carry, but never sniffed.
    listing = client.get("/v1/experiments")
    assert "content-security-policy" not in listing.headers
    assert listing.headers["x-content-type-options"] == "nosniff"
