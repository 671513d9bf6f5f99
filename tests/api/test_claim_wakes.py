"""Waiting claims are woken by as many experiments as were queued, not all at once."""

import re
import threading
import time
from typing import Any

import httpx

from tests.conftest import LiveServer, make_settings
from tests.helpers import register
from vramlab.contract import CLAIM_BATCH_PATH

CPU = {"op": "add", "shape": [8], "dtype": "float32", "device": "cpu"}


def looks(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    found = re.findall(r'^vramlab_claim_looks_total\{found="(\w+)"\} ([0-9.e+]+)$', text, re.M)
    return {k: float(v) for k, v in found}


def test_one_submit_wakes_one_of_the_waiting_claims(database_url: str) -> None:
    """Four loops wait for work; one experiment is queued. Only one claim looks again (and
    takes it): before, every waiting claim woke and each took the database to find
    nothing, three wasted transactions a submit, which bound how fast tiny experiments
    could be fed one POST at a time."""
    # Longer than the test: no claim looks again on its poll, only when woken.
    settings = make_settings(database_url, claim_wait_seconds=8.0, claim_poll_seconds=8.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        ids = [register(client, name=f"loop-{i}") for i in range(4)]
        answers: list[httpx.Response] = []

        def wait(worker_id: str) -> None:
            body = {"worker_id": worker_id, "wait_s": 6, "max": 8}
            with httpx.Client(base_url=live.url, timeout=30) as own:
                answers.append(own.post(CLAIM_BATCH_PATH, json=body))

        threads = [threading.Thread(target=wait, args=(w,)) for w in ids]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while looks(client).get("false", 0) < 4:  # each claim looked once, found nothing
            assert time.monotonic() < deadline, looks(client)
            time.sleep(0.02)
        exp: dict[str, Any] = client.post("/v1/experiments", json=CPU).json()
        while not answers:
            assert time.monotonic() < deadline, looks(client)
            time.sleep(0.02)
        assert answers[0].status_code == 200
        assert [e["id"] for e in answers[0].json()["experiments"]] == [exp["id"]]
        for t in threads:
            t.join()
        assert sorted(a.status_code for a in answers) == [200, 204, 204, 204]
        # Counted once every claim has answered: each of the three others looked once as
        # it began and once as its wait ran out; a claim woken for nothing would have
        # looked once more.
        assert looks(client) == {"true": 1.0, "false": 7.0}
