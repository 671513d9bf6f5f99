"""Many claimers at once: every experiment is claimed exactly once, on both engines."""

import threading
from collections import Counter

import httpx

from tests.conftest import LiveServer
from tests.helpers import claim, register, submit, succeed

EXPERIMENTS = 60
CLAIMERS = 8


def test_every_experiment_is_claimed_exactly_once(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        ids = {submit(client, tags=["load"])["id"] for _ in range(EXPERIMENTS)}
    claimed: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            worker = register(c, name=f"claimer-{n}")
            while (got := claim(c, worker)) is not None:
                response = succeed(c, got)
                with lock:
                    claimed.append(got["id"])
                    if response.status_code != 200:
                        errors.append(response.text)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Counter(claimed).most_common(1)[0][1] == 1
    assert set(claimed) == ids
    with httpx.Client(base_url=server.url) as client:
        page = client.get("/v1/experiments", params={"status": "succeeded", "limit": 200}).json()
        assert len(page["items"]) == EXPERIMENTS
        assert {e["attempts"] for e in page["items"]} == {1}
