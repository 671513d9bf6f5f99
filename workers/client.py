"""The worker's HTTP client for the API's worker protocol. Knows nothing of torch."""

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

log = logging.getLogger("vramlab.worker")
T = TypeVar("T")


class LeaseLost(Exception):
    """The API says this lease no longer owns its experiment (409)."""


class UnknownWorker(Exception):
    """The API does not know this worker id (404): register again."""


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code == 409:
            raise LeaseLost(response.text)
        if response.status_code == 404 and "worker" in response.text:
            raise UnknownWorker(response.text)
        response.raise_for_status()
        return response

    def register(self, name: str, hostname: str, capabilities: dict[str, Any]) -> dict[str, Any]:
        body = {"name": name, "hostname": hostname, "capabilities": capabilities}
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


def with_retry(
    call: Callable[[], T],
    *,
    what: str,
    should_stop: Callable[[], bool],
    max_delay: float = 10.0,
) -> T | None:
    """Call until it succeeds, backing off on network errors and 5xx answers.

    Other errors (4xx, LeaseLost, UnknownWorker) go to the caller. Returns None when
    asked to stop before a call succeeded.
    """
    delay = 0.2
    while not should_stop():
        try:
            return call()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code < 500 and exc.response.status_code != 429:
                raise
            log.warning(
                "%s: API answered %s; retrying in %.1fs", what, exc.response.status_code, delay
            )
        except httpx.TransportError as exc:
            log.warning("%s: API unreachable (%s); retrying in %.1fs", what, exc, delay)
        time.sleep(delay)
        delay = min(max_delay, delay * 2)
    return None
