"""Many leases expiring at once while 8 claimers claim: no 503, exactly once.

A worker host that dies with work in hand leaves many leases that expire together. The
claims that follow must neither deadlock on each other (PostgreSQL answers a detected
deadlock with an error: a 503) nor hand one experiment to two live leases. The leases
expire by moving the app's clock between rounds, not by sleeping: in each round every
claimer claims, reports one claim in three and abandons the others (its worker "died");
then the clock passes every abandoned lease at once, and the next round's claims run
while the API puts them back. Before claims left expired leases to the reaper, claims
that each requeued them in one bulk UPDATE deadlocked here on PostgreSQL (a dozen 503s
in most runs; the deadlock depends on timing, so not in every run).
"""

import threading
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import httpx

from tests.conftest import Clock, LiveServer, make_settings
from tests.helpers import ADD, MEMORY, register

CLAIMERS = 8
CLAIMS = 1536
ROUNDS = 12
PER_ROUND = CLAIMS // ROUNDS // CLAIMERS  # each claimer's claims in a round
EXPERIMENTS = 1100  # more than the reported claims and a round: the queue never runs dry
LEASE_S = 30


def test_claims_while_many_leases_expire_at_once(database_url: str) -> None:
    clock = Clock()
    settings = make_settings(
        database_url,
        lease_seconds=LEASE_S,
        max_attempts=100,
        claim_wait_seconds=60.0,
        db_wait_seconds=60.0,
    )
    with LiveServer(settings, clock) as live:
        with httpx.Client(base_url=live.url, timeout=60) as c, ThreadPoolExecutor(8) as pool:
            spec = {**ADD, "shape": [4, 4]}
            codes = pool.map(
                lambda _: c.post("/v1/experiments", json=spec).status_code, range(EXPERIMENTS)
            )
            assert set(codes) == {202}
        answers: Counter[int] = Counter()
        reports: Counter[int] = Counter()
        # (experiment, round, abandoned) for every claim, in the order each claimer made them.
        claims: list[tuple[str, int, bool]] = []
        lock = threading.Lock()
        rounds = threading.Barrier(CLAIMERS + 1)

        def claimer(n: int) -> None:
            with httpx.Client(base_url=live.url, timeout=120) as c:
                worker = register(c, name=f"claimer-{n}")
                for r in range(ROUNDS):
                    rounds.wait()
                    for i in range(PER_ROUND):
                        got = c.post("/v1/worker/claim", json={"worker_id": worker, "wait_s": 60})
                        with lock:
                            answers[got.status_code] += 1
                        if got.status_code != 200:
                            continue
                        exp = got.json()
                        abandon = i % 3 != 0
                        with lock:
                            claims.append((exp["id"], r, abandon))
                        if abandon:
                            continue
                        body = {
                            "lease_token": exp["lease_token"],
                            "status": "succeeded",
                            "result": {"memory": MEMORY},
                        }
                        done = c.post(f"/v1/worker/experiments/{exp['id']}/result", json=body)
                        with lock:
                            reports[done.status_code] += 1
                    rounds.wait()

        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
        for t in threads:
            t.start()
        for _ in range(ROUNDS):
            rounds.wait()  # the claimers claim
            rounds.wait()  # every claimer is done with this round
            clock.advance(LEASE_S + 1)  # every lease abandoned in it expires at once
        for t in threads:
            t.join()

        assert answers == {200: CLAIMERS * ROUNDS * PER_ROUND}, answers
        assert set(reports) == {200}, reports
        # Exactly once: an experiment is claimed again only after the lease that held it
        # was abandoned in an earlier round (and so had expired), and only once for it.
        held: dict[str, list[tuple[int, bool]]] = defaultdict(list)
        for exp_id, r, abandoned in claims:
            held[exp_id].append((r, abandoned))
        for exp_id, history in held.items():
            history.sort()
            for (r1, abandoned), (r2, _) in pairwise(history):
                assert abandoned and r1 < r2, (exp_id, history)
        with httpx.Client(base_url=live.url, timeout=60) as c:
            metrics = c.get("/metrics").text
        reported = sum(1 for _, _, abandoned in claims if not abandoned)
        assert f'vramlab_experiments{{status="succeeded"}} {float(reported)}' in metrics
