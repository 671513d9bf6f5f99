"""Property-based: whatever a client sends, an accepted spec stays under the byte cap
and a rejected one never reaches the queue."""

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.catalog import DTYPES, OPS
from tests.conftest import LiveServer, make_settings

CAP = 64 * 2**20
dims = st.one_of(st.integers(0, 64), st.integers(0, 2**33), st.integers(-5, -1))
shapes = st.lists(dims, max_size=10)
param_values = st.one_of(
    shapes, st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True), st.text(max_size=8)
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from([*OPS, "nope"]))
    known = [p.name for p in OPS[op].params] if op in OPS else []
    names = st.sampled_from([*known, "bogus"]) if known else st.just("bogus")
    params = draw(st.dictionaries(names, param_values, max_size=3))
    return {
        "op": op,
        "shape": draw(shapes),
        "params": params,
        "dtype": draw(st.sampled_from([*DTYPES, "float128"])),
        "device": draw(st.sampled_from(["cpu", "cuda", "cuda:1", "cuda:99", "tpu"])),
        "repeat": draw(st.integers(-1, 2000)),
    }


def test_accepted_specs_stay_under_the_cap_and_rejected_ones_never_queue(database_url: str) -> None:
    accepted: list[dict[str, Any]] = []
    with LiveServer(make_settings(database_url, max_experiment_bytes=CAP)) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:

            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                database=None,
            )
            @given(spec=specs())
            def check(spec: dict[str, Any]) -> None:
                # json.dumps writes NaN and Infinity, which a hostile client may send.
                body = json.dumps(spec).encode()
                response = client.post(
                    "/v1/experiments", content=body, headers={"Content-Type": "application/json"}
                )
                assert response.status_code in (202, 422), response.text
                if response.status_code == 202:
                    prediction = response.json()["prediction"]
                    total = sum(t["bytes"] for t in prediction["inputs"] + prediction["outputs"])
                    assert total <= CAP
                    accepted.append(response.json())
                else:
                    assert response.json()["error"]["details"][0]["field"]

            check()
            listed = client.get("/v1/experiments", params={"limit": 200}).json()["items"]
            assert {e["id"] for e in listed} == {e["id"] for e in accepted}
