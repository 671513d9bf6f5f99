"""The worker's liveness probe as the cluster runs it (deploy/k8s/worker/worker.yaml's
command) on the file a worker loop keeps while it works against the real API: it passes
while the loop waits for work and all through an experiment as long as its time limit, and
fails once the loop has stalled (an experiment held past its limit)."""

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, submit
from tests.workers.test_loop import FakeRunner, succeeded
from workers.alive import Pulse
from workers.client import ApiClient
from workers.endings import Outcome
from workers.loop import WorkerLoop

ROOT = Path(__file__).resolve().parents[2]
PROBED = "/tmp/vramlab-alive"


def probe_command() -> list[str]:
    manifest = yaml.safe_load((ROOT / "deploy" / "k8s" / "worker" / "worker.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--alive-file") + 1] == PROBED
    command: list[str] = container["livenessProbe"]["exec"]["command"]
    assert PROBED in command[-1]
    return command


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_the_probe_passes_through_a_long_experiment_and_fails_once_the_loop_stalls(
    database_url: str, tmp_path: Path
) -> None:
    alive = tmp_path / "alive"
    command = [*probe_command()[:-1], probe_command()[-1].replace(PROBED, str(alive))]

    def probe() -> bool:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    running, release = threading.Event(), [threading.Event(), threading.Event()]
    runs = iter(release)

    def script(**_: Any) -> Outcome:
        mine = next(runs)
        running.set()
        assert mine.wait(120)
        running.clear()
        return succeeded()

    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as http:
        long_one = submit(http, {**ADD, "timeout_s": 3600})
        held = submit(http, {**ADD, "timeout_s": 1})
        client = ApiClient(live.url)
        loop = WorkerLoop(client, FakeRunner(script), name="t", wait_s=1, pulse=Pulse(alive))
        loop.run_slack_s = 1.0  # the runner's room to end an experiment, short for the test
        worker = threading.Thread(target=loop.run, daemon=True)
        worker.start()
        try:
            wait_until(running.is_set)
            # An hour's experiment: the probe holds for all of it.
            assert probe()
            assert alive.stat().st_mtime >= time.time() + 3600 - 60
            release[0].set()
            wait_until(lambda: http.get(f"/v1/experiments/{long_one['id']}").json()["status"]
                       == "succeeded")  # fmt: skip
            # One second's experiment held past its limit and the runner's room: stalled.
            wait_until(running.is_set)
            wait_until(lambda: not probe())
            release[1].set()
            # Going again: it reports, then waits for work, and the probe passes again.
            wait_until(lambda: http.get(f"/v1/experiments/{held['id']}").json()["status"]
                       == "succeeded")  # fmt: skip
            wait_until(probe)
        finally:
            for event in release:
                event.set()
            loop.stopping.set()
            worker.join(timeout=60)
            client.close()
    assert not worker.is_alive()
