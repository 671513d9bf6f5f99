"""Every route that names an experiment, a sweep or a snapshot takes a unique prefix of
its id (the 8 characters that ``vramlab ls`` and the pages print); on SQLite and
PostgreSQL."""

import httpx
from sqlalchemy import create_engine, text

from app.core.config import normalise_database_url
from tests.helpers import ADD, submit
from tests.snapshots.synthetic import dumps, training_snapshot

# Ids that share prefixes, and that end in the digits whose successors are special.
TWIN_A = "4608477a-0000-4000-8000-000000000001"
TWIN_B = "4608477a-0000-4000-8000-000000000002"
ALL_F = "4609ffff-ffff-4fff-8fff-ffffffffffff"
NINE = "4619ffff-0000-4000-8000-000000000000"


def _renamed(client: httpx.Client, database_url: str, new_ids: list[str]) -> None:
    """Queue one experiment per id through the API, then give each the id wanted."""
    made = [submit(client)["id"] for _ in new_ids]
    engine = create_engine(normalise_database_url(database_url))
    try:
        with engine.begin() as conn:
            for old, new in zip(made, new_ids, strict=True):
                conn.execute(
                    text("UPDATE experiments SET id = :new WHERE id = :old"),
                    {"new": new, "old": old},
                )
    finally:
        engine.dispose()


def test_an_experiment_is_found_by_a_unique_prefix(client: httpx.Client, database_url: str) -> None:
    _renamed(client, database_url, [TWIN_A, TWIN_B, ALL_F, NINE])
    for given, found in [
        (TWIN_A, TWIN_A),
        ("4608477a-0000-4000-8000-00000000000", None),
        ("4609", ALL_F),
        ("4609FFFF", ALL_F),
        ("4609ffff-ff", ALL_F),
        ("4619", NINE),
        ("4619ffff-", NINE),
        (NINE.upper(), NINE),
    ]:
        response = client.get(f"/v1/experiments/{given}")
        if found is None:
            assert response.status_code == 409, response.text
            continue
        assert response.status_code == 200, (given, response.text)
        assert response.json()["id"] == found
    # A prefix that two ids start with: 409, naming both, in the one error shape.
    twins = client.get("/v1/experiments/4608477a")
    assert twins.status_code == 409
    error = twins.json()["error"]
    assert error["type"] == "ambiguous_id"
    assert error["details"]["matches"] == [TWIN_A, TWIN_B]
    assert TWIN_A in error["message"] and TWIN_B in error["message"]
    # Too short to name one: a 422 that says how many characters to give.
    short = client.get("/v1/experiments/460")
    assert short.status_code == 422
    assert "at least 4 characters" in short.json()["error"]["message"]
    assert client.get("/v1/experiments/4620").status_code == 404
    assert client.get("/v1/experiments/nope").status_code == 404
    # Every route under the experiment takes it, the state-changing ones included.
    assert client.get("/v1/experiments/4609ffff/peak").status_code in (200, 404, 409)
    cancelled = client.post("/v1/experiments/4619ffff/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["id"] == NINE
    # Compare takes prefixes too; one experiment named twice is compared once.
    out = client.get("/v1/compare", params={"ids": f"4609ffff,{NINE[:8]},{NINE}"})
    assert out.status_code == 200, out.text
    assert [i["id"] for i in out.json()["items"]] == [ALL_F, NINE]
    assert client.get("/v1/compare", params={"ids": "4608477a"}).status_code == 409
    assert client.get("/v1/compare/timeline", params={"ids": "4608"}).status_code == 409


def test_sweeps_and_snapshots_by_prefix(client: httpx.Client) -> None:
    sweep = client.post("/v1/sweeps", json={"spec": ADD, "grid": {"shape": [[8], [16]]}}).json()
    by_prefix = client.get(f"/v1/sweeps/{sweep['id'][:8]}")
    assert by_prefix.status_code == 200 and by_prefix.json()["id"] == sweep["id"]
    assert client.get(f"/v1/sweeps/{sweep['id'][:8]}/plot").status_code == 200
    assert client.get(f"/v1/sweeps/{sweep['id'][:3]}").status_code == 422

    response = client.post(
        "/v1/snapshots",
        content=dumps(training_snapshot(iterations=1)),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    read = client.get(f"/v1/snapshots/{sid[:8]}")
    assert read.status_code == 200 and read.json()["id"] == sid
    assert client.get(f"/v1/snapshots/{sid[:8]}/peak").status_code == 200
    assert client.get(f"/v1/experiments/{sid[:8]}").json()["id"] == sid
    # A snapshot route looks among snapshots only.
    exp = submit(client)["id"]
    assert client.get(f"/v1/snapshots/{exp[:8]}").status_code == 404
