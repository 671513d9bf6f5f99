"""The worker's HTTP client for the API's worker protocol. Knows nothing of torch."""

import importlib.metadata
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from vramlab import contract

log = logging.getLogger("vramlab.worker")
T = TypeVar("T")
# How much of a refusal's body a worker keeps (logs, the failure it reports instead).
REFUSAL_CHARS = 500
STOP_POLL_S = 0.1
# On the way out the worker does not wait long for an API that does not answer.
STOP_TIMEOUT_S = 1.0


class LeaseLost(Exception):
    """The API says this lease no longer owns its experiment (409)."""


class UnknownWorker(Exception):
    """The API does not know this worker id (404): register again."""


class Refused(Exception):
    """The API refused a call for good (a 4xx other than 409 and 429): retrying the same
    request cannot help. ``message`` is the API's answer, cut to ``REFUSAL_CHARS``."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message


def worker_version() -> str | None:
    """This worker's distribution's version (``vramlab-worker``), which it says at
    register; None where it runs from a checkout that was never installed."""
    try:
        return importlib.metadata.version(contract.WORKER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _refusal_text(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        text = f"{error['type']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        text = response.text
    return text[:REFUSAL_CHARS]


class ApiClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 30.0,
        version: str | None = None,
    ) -> None:
        # The version it says at register: this distribution's, unless told another.
        self.version = version or worker_version()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _check(self, response: httpx.Response) -> httpx.Response:
        code = response.status_code
        if code == 409:
            raise LeaseLost(response.text)
        if code == 404 and "worker" in response.text:
            raise UnknownWorker(response.text)
        if 400 <= code < 500 and code != 429:
            raise Refused(code, _refusal_text(response))
        response.raise_for_status()  # 5xx and 429: with_retry tries again
        return response

    def register(self, name: str, hostname: str, capabilities: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "hostname": hostname, "capabilities": capabilities}
        if self.version is not None:  # the API refuses a worker too old for it
            body["version"] = self.version
        data: dict[str, Any] = self._check(self.http.post("/v1/worker/register", json=body)).json()
        return data

    def claim(self, worker_id: str, wait_s: float) -> dict[str, Any] | None:
        response = self.http.post(
            "/v1/worker/claim",
            json={"worker_id": worker_id, "wait_s": wait_s},
            timeout=wait_s + 30,
        )
        if response.status_code == 204:
            return None
        data: dict[str, Any] = self._check(response).json()
        return data

    def claim_many(self, worker_id: str, wait_s: float, most: int) -> list[dict[str, Any]]:
        """Up to ``most`` experiments, each with its own lease; [] when none came in wait_s."""
        response = self.http.post(
            contract.CLAIM_BATCH_PATH,
            json={"worker_id": worker_id, "wait_s": wait_s, "max": most},
            timeout=wait_s + 30,
        )
        if response.status_code == 204:
            return []
        claimed: list[dict[str, Any]] = self._check(response).json()["experiments"]
        return claimed

    def report_many(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several outcomes (each with ``experiment_id`` and ``lease_token``) in one
        request; a verdict for each (contract.ReportVerdict), in their order."""
        response = self.http.post(contract.REPORT_BATCH_PATH, json={"results": items})
        verdicts: list[dict[str, Any]] = self._check(response).json()["results"]
        return verdicts

    def heartbeat(self, exp_id: str, token: str) -> dict[str, Any]:
        body = {"lease_token": token}
        path = f"/v1/worker/experiments/{exp_id}/heartbeat"
        data: dict[str, Any] = self._check(self.http.post(path, json=body)).json()
        return data

    def upload_trace(self, exp_id: str, token: str, seq: int, gz: bytes) -> None:
        self._check(
            self.http.put(
                f"/v1/worker/experiments/{exp_id}/trace/{seq}",
                content=gz,
                headers={"X-Lease-Token": token, "Content-Type": "application/gzip"},
            )
        )

    def report(self, exp_id: str, token: str, outcome: dict[str, Any]) -> None:
        body = {"lease_token": token, **outcome}
        self._check(self.http.post(f"/v1/worker/experiments/{exp_id}/result", json=body))

    def release(self, exp_id: str, token: str) -> None:
        body = {"lease_token": token}
        self._check(self.http.post(f"/v1/worker/experiments/{exp_id}/release", json=body))

    def stop(self, worker_id: str) -> None:
        """Tell the API this worker is leaving: it stops counting as live at once."""
        body = {"worker_id": worker_id}
        self._check(self.http.post("/v1/worker/stop", json=body, timeout=STOP_TIMEOUT_S))


def with_retry(
    call: Callable[[], T],
    *,
    what: str,
    should_stop: Callable[[], bool],
    max_delay: float = 10.0,
    on_try: Callable[[], None] | None = None,
) -> T | None:
    """Call until it succeeds, backing off on network errors, 5xx and 429 answers.

    Other errors (Refused, LeaseLost, UnknownWorker) go to the caller. Returns None when
    asked to stop before a call succeeded; the back-off looks at ``should_stop`` every
    ``STOP_POLL_S``, so a stop is never held up by a long delay. ``on_try`` runs before
    each attempt (the worker's sign of life: an attempt is progress, workers/alive.py).
    """
    delay = 0.2
    while not should_stop():
        if on_try is not None:
            on_try()
        try:
            return call()
        except httpx.HTTPStatusError as exc:
            log.warning(
                "%s: API answered %s; retrying in %.1fs", what, exc.response.status_code, delay
            )
        except httpx.TransportError as exc:
            log.warning("%s: API unreachable (%s); retrying in %.1fs", what, exc, delay)
        until = time.monotonic() + delay
        while not should_stop() and (left := until - time.monotonic()) > 0:
            time.sleep(min(STOP_POLL_S, left))
        delay = min(max_delay, delay * 2)
    return None
