"""The Python client of a vramlab service: ``Client().submit(spec, wait=True)``.

Thin and typed: each method is one call of the HTTP API (``/v1/...``) and returns its
JSON as plain data (dicts, as the API's reference documents them). Any answer the API
refuses raises :class:`~vramlab.errors.ApiError`, which carries the API's error shape.
The server is ``api`` or ``VRAMLAB_API_URL``; the token ``token`` or ``VRAMLAB_TOKEN``.
"""

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from vramlab import recorder
from vramlab.errors import ApiError, ClientError, GaveUp, checked
from vramlab.names import FINISHED, FitStatus, Status
from vramlab.recorder import Recording

DEFAULT_API = "http://127.0.0.1:8000"
# A hub that did not answer (a hub id's config.json) is not asked again at once.
HUB_UNAVAILABLE = "hub_unavailable"
PLAN_ATTEMPTS = 4  # a plan past the service's time bound is asked again (503, then cached)
FULL_ID = 36
TERMINAL = tuple(str(s) for s in Status if s in FINISHED)

# Called while waiting: what the API said last, and the seconds waited so far.
Progress = Callable[[dict[str, Any], float], None]
# How long one progress read may wait for a change (well inside the HTTP timeout).
LONG_POLL_S = 10.0


class Client:
    """One vramlab service, by URL and token; use as a context manager or ``close()``."""

    def __init__(
        self, api: str | None = None, token: str | None = None, timeout: float = 60
    ) -> None:
        self.api = api or os.environ.get("VRAMLAB_API_URL") or DEFAULT_API
        self.token = token if token is not None else os.environ.get("VRAMLAB_TOKEN")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.api, headers=headers, timeout=timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, **params: Any) -> Any:
        return checked(self.http.get(path, params=params or None))

    def _post(self, path: str, body: Any = None) -> Any:
        return checked(self.http.post(path, json=body))

    # -- experiments ----------------------------------------------------------------

    def submit(
        self,
        spec: Mapping[str, Any],
        wait: bool = False,
        *,
        poll_s: float = 0.5,
        give_up_s: float = 30.0,
        on_progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Queue one experiment (``POST /v1/experiments``); with ``wait``, until it ends."""
        exp: dict[str, Any] = self._post("/v1/experiments", dict(spec))
        return self.wait(exp["id"], poll_s, give_up_s, on_progress) if wait else exp

    def run_preset(self, preset: str, **body: Any) -> dict[str, Any]:
        """Queue a named experiment (``vramlab presets``): size, device, dtype, isolation."""
        exp: dict[str, Any] = self._post(f"/v1/presets/{preset}/runs", body)
        return exp

    def presets(self) -> list[dict[str, Any]]:
        listing: list[dict[str, Any]] = self._get("/v1/presets")
        return listing

    def wait(
        self,
        exp_id: str,
        poll_s: float = 0.5,
        give_up_s: float = 30.0,
        on_progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Poll until the experiment has finished. Raise GaveUp once no live worker has
        been able to run it for ``give_up_s`` seconds (queued work that a busy worker will
        reach is waited for)."""
        started = time.monotonic()
        stuck_since: float | None = None
        while True:
            exp: dict[str, Any] = self._get(f"/v1/experiments/{exp_id}")
            now = time.monotonic()
            queue = exp.get("queue") or {}
            if on_progress is not None:
                on_progress(exp, now - started)
            if exp["status"] in TERMINAL:
                return exp
            if exp["status"] == Status.QUEUED and queue.get("runnable") is False:
                stuck_since = now if stuck_since is None else stuck_since
                if now - stuck_since >= give_up_s:
                    raise GaveUp(
                        f"gave up waiting for {exp_id[:8]} after {now - started:.0f}s: "
                        f"{queue.get('reason') or ''}. "
                        f"It stays queued; `vramlab cancel {exp_id[:8]}` removes it"
                    )
            else:
                stuck_since = None
            time.sleep(poll_s)

    def resolve_id(self, given: str) -> str:
        """A full experiment id from a unique prefix of one (as ``ls`` and the pages print)."""
        if len(given) >= FULL_ID:
            return given
        if not given or any(c not in "0123456789abcdefABCDEF-" for c in given):
            raise ClientError(f"{given!r} is not an experiment id nor the start of one")
        page = self._get("/v1/experiments", id_prefix=given, limit=10)
        ids = [item["id"] for item in page["items"]]
        if not ids:
            raise ClientError(f"no experiment id starts with {given!r}")
        if len(ids) > 1:
            listing = ", ".join(ids) + (" …" if page.get("next_cursor") else "")
            raise ClientError(f"{given!r} matches several experiments: {listing}; give more of it")
        return str(ids[0])

    def show(self, exp_id: str) -> dict[str, Any]:
        """One experiment, by its id or a unique prefix of it."""
        exp: dict[str, Any] = self._get(f"/v1/experiments/{self.resolve_id(exp_id)}")
        return exp

    def cancel(self, exp_id: str) -> dict[str, Any]:
        exp: dict[str, Any] = self._post(f"/v1/experiments/{self.resolve_id(exp_id)}/cancel")
        return exp

    def list(self, **filters: Any) -> dict[str, Any]:
        """A page of experiments, newest first: status, op, device, tag, limit, cursor."""
        page: dict[str, Any] = self._get(
            "/v1/experiments", **{k: v for k, v in filters.items() if v}
        )
        return page

    def trace(self, exp_id: str, out: BinaryIO, fmt: str = "ndjson") -> None:
        """Write an experiment's trace to ``out``: json, ndjson, memory_viz or chrome."""
        url = f"/v1/experiments/{self.resolve_id(exp_id)}/trace"
        if fmt == "json":
            # The JSON form pages; write every page into one array as it arrives.
            out.write(b"[")
            offset: int | None = 0
            first = True
            while offset is not None:
                page = self._get(url, format="json", offset=offset, limit=10_000)
                for event in page["events"]:
                    out.write((b"" if first else b",\n") + json.dumps(event).encode())
                    first = False
                offset = page["next_offset"]
            out.write(b"]\n")
            return
        with self.http.stream("GET", url, params={"format": fmt}) as response:
            if not response.is_success:
                response.read()
                checked(response)
            for block in response.iter_bytes():
                out.write(block)

    def compare(self, exp_ids: Sequence[str]) -> dict[str, Any]:
        ids = [self.resolve_id(i) for i in exp_ids]
        out: dict[str, Any] = self._get("/v1/compare", ids=",".join(ids))
        return out

    # -- sweeps ---------------------------------------------------------------------

    def sweep(
        self,
        spec: Mapping[str, Any],
        grid: Mapping[str, Sequence[Any]],
        wait: bool = False,
        *,
        poll_s: float = 0.5,
        on_progress: Progress | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Queue every combination of ``grid``'s values over ``spec`` (``POST /v1/sweeps``)."""
        body = {"spec": dict(spec), "grid": dict(grid), **fields}
        sweep: dict[str, Any] = self._post("/v1/sweeps", body)
        return self.wait_sweep(sweep, poll_s, on_progress) if wait else sweep

    def sweep_progress(
        self, sweep_id: str, seen: str | None = None, wait_s: float = 0.0
    ) -> dict[str, Any]:
        """A sweep's counts by status (``GET /v1/sweeps/{id}/progress``); with ``seen`` (a
        ``version`` read before), the next change, waiting up to ``wait_s`` for it."""
        params: dict[str, Any] = {} if seen is None else {"seen": seen, "wait": wait_s}
        out: dict[str, Any] = self._get(f"/v1/sweeps/{sweep_id}/progress", **params)
        return out

    def wait_sweep(
        self, sweep: dict[str, Any], poll_s: float = 0.5, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        """Follow a sweep until it is done, then read it with its rows. Progress is
        long-polled: each read answers when the counts change, at most one every
        ``poll_s``; ``on_progress`` gets each (``n_points``, ``progress``, ``done``)."""
        started = time.monotonic()
        seen: str | None = None
        wait_s = min(LONG_POLL_S, (self.http.timeout.read or 2 * LONG_POLL_S) / 2)
        while not sweep["done"]:
            last = time.monotonic()
            sweep = self.sweep_progress(sweep["id"], seen, wait_s)
            seen = sweep["version"]
            if on_progress is not None:
                on_progress(sweep, time.monotonic() - started)
            if not sweep["done"]:
                time.sleep(max(0.0, poll_s - (time.monotonic() - last)))
        out: dict[str, Any] = self._get(f"/v1/sweeps/{sweep['id']}")
        return out

    def sweep_csv(self, sweep_id: str) -> str:
        return self.http.get(f"/v1/sweeps/{sweep_id}", params={"format": "csv"}).text

    # -- fit searches ---------------------------------------------------------------

    def fit(
        self,
        model: str,
        *,
        vary: str = "batch_size",
        task: str = "train",
        params: Mapping[str, Any] | None = None,
        variants: Iterable[Mapping[str, Any]] = (),
        device: str | None = None,
        capacity_bytes: int | None = None,
        gpu: str | None = None,
        max_value: int | None = None,
        wait: bool = False,
        poll_s: float = 1.0,
        on_progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Search the largest ``vary`` (batch_size or seq_len) of a model that fits a
        capacity (``capacity_bytes``, or a registered worker's ``gpu`` by name).
        ``variants``: more searches, each with these params overridden."""
        spec: dict[str, Any] = {
            "op": "model",
            "shape": [],
            "params": {"model": model, "task": task, **(params or {})},
        }
        if device:
            spec["device"] = device
        body: dict[str, Any] = {
            "spec": spec,
            "vary": vary,
            "variants": [{}, *(dict(v) for v in variants)],
        }
        if capacity_bytes is not None:
            body["capacity_bytes"] = capacity_bytes
        if gpu:
            body["requirements"] = {"gpu_name": gpu}
        if max_value is not None:
            body["max_value"] = max_value
        fit: dict[str, Any] = self._post("/v1/fits", body)
        return self.wait_fit(fit, poll_s, on_progress) if wait else fit

    # -- plans and the GPU catalog ------------------------------------------------

    def plan(
        self,
        model: str,
        *,
        gpus: Iterable[str] = (),
        capacity_bytes: int | None = None,
        vary: str = "batch_size",
        task: str = "train",
        params: Mapping[str, Any] | None = None,
        variants: Iterable[Mapping[str, Any]] = (),
        suggest: bool = True,
        verify: bool = True,
    ) -> dict[str, Any]:
        """Will a model's step fit these GPUs (names from ``gpus()``, loosely matched) or
        ``capacity_bytes``: predicted, nothing run. ``variants``: more answers, each with
        these params overridden (the spec as given is always the first)."""
        body: dict[str, Any] = {
            "spec": {"op": "model", "params": {"model": model, "task": task, **(params or {})}},
            "gpus": list(gpus),
            "vary": vary,
            "variants": [{}, *(dict(v) for v in variants)],
            "suggest": suggest,
            "verify": verify,
        }
        if capacity_bytes is not None:
            body["capacity_bytes"] = capacity_bytes
        # A plan traces steps for up to 90 s (the service's bound), past the usual timeout;
        # one that runs past its bound answers 503, and asked again it goes on from what
        # the service's predictor has cached.
        for attempt in range(PLAN_ATTEMPTS):
            try:
                out: dict[str, Any] = checked(self.http.post("/v1/plans", json=body, timeout=120))
                return out
            except ApiError as exc:
                last = attempt == PLAN_ATTEMPTS - 1
                if exc.status_code != 503 or exc.type == HUB_UNAVAILABLE or last:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def gpus(self) -> dict[str, Any]:
        """The GPU catalog (``items``): each card's total and usable memory, compute
        capability, bf16, cuBLAS's workspace."""
        out: dict[str, Any] = self._get("/v1/gpus")
        return out

    def wait_fit(
        self, fit: dict[str, Any], poll_s: float = 1.0, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        while not FitStatus(fit["status"]).finished:
            time.sleep(poll_s)
            fit = self._get(f"/v1/fits/{fit['id']}")
            if on_progress is not None:
                on_progress(fit, time.monotonic() - started)
        return fit

    def fit_show(self, fit_id: str) -> dict[str, Any]:
        fit: dict[str, Any] = self._get(f"/v1/fits/{fit_id}")
        return fit

    def fits(self, status: str | None = None, limit: int = 20) -> dict[str, Any]:
        filters: dict[str, Any] = {"limit": limit}
        if status:
            filters["status"] = status
        page: dict[str, Any] = self._get("/v1/fits", **filters)
        return page

    def fit_cancel(self, fit_id: str) -> dict[str, Any]:
        fit: dict[str, Any] = self._post(f"/v1/fits/{fit_id}/cancel")
        return fit

    # -- snapshots and recordings ---------------------------------------------------

    def upload_snapshot(
        self,
        path: str | Path,
        name: str | None = None,
        tags: Sequence[str] = (),
        program_exit: int | None = None,
    ) -> dict[str, Any]:
        """Upload a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``'s
        pickle), gzipped as it streams; the API's summary of it. ``program_exit``: how
        the program that wrote it ended (its exit status, or minus the signal that killed
        it); anything but 0 marks the snapshot partial."""
        path = Path(path)
        params: dict[str, Any] = {"name": name or path.name, "tag": list(tags)}
        if program_exit is not None:
            params["program_exit"] = program_exit
        response = self.http.post(
            "/v1/snapshots",
            params=params,
            content=recorder.gzipped(path),
            headers={"Content-Type": "application/octet-stream"},
            timeout=httpx.Timeout(600, connect=10),
        )
        snap: dict[str, Any] = checked(response)
        return snap

    def record(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        tags: Sequence[str] = (),
        stacks: str = "all",
        max_entries: int | None = None,
    ) -> Recording:
        """Run a program here with PyTorch's allocation history on (``vramlab record``)
        and upload the snapshot it leaves. The program's exit status is the Recording's
        ``code``; ``snapshot`` is None when it left none (no CUDA). FileNotFoundError:
        no such program."""
        with recorder.recorded(argv, stacks, max_entries) as run:
            if run.path is None:
                return Recording(run.code, None)
            snap = self.upload_snapshot(
                run.path, name or run.name, [*tags, *run.tags], program_exit=run.code
            )
        return Recording(run.code, snap)
