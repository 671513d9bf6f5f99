"""A hub id's config.json, fetched by the API (``VRAMLAB_HUB_CONFIGS=on``) so that a model
spec may name ``owner/name[@revision]`` instead of carrying its config.json inline.

Only ``{hub}/{owner}/{name}/resolve/{revision}/config.json`` is ever asked for: never
weights, never another file. The id is checked against a strict pattern before it is put
in a URL, so it cannot choose the host, the scheme or the path's shape (no ``..``, no
``%``, ``?``, ``#``, ``@`` or ``:`` inside a part); redirects are followed only to the
hub's own origin (a renamed repository), at most a few. The body is read up to a size cap
within one deadline, parsed as JSON, and checked exactly as an inline ``config_json``
(finetune.check_document: ``auto_map`` and other code-loading keys refused). The spec
then carries the document as its ``config_json``: the predictor and the worker get plain
data and never fetch anything, and the experiment's record keeps the config it ran.

Fetched documents are kept in a small in-memory cache per API process (by hub, id and
revision): a pinned commit for as long as it stays among the most recent, a branch such
as ``main`` for ``hub_cache_seconds``. Failures are not kept.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.catalog.finetune import check_document
from app.catalog.model import MAX_TEXT
from app.core.config import Settings
from app.core.errors import ApiError, InvalidSpec
from vramlab.catalog.errors import CatalogError
from vramlab.catalog.model_zoo import HUB_NAMES, PRESETS, kinds_of

FIELD = "params.model"
# The hub's own rules for repository names (letters, digits, '-', '_', '.', at most 96 a
# part), and a revision that is a branch, a tag or a commit without '/' (refs/pr/N is not
# taken: pin the commit instead).
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REVISION = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>{_REVISION}))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_REDIRECTS = 3
# The body as sent, uncompressed: its size is what the cap counts.
_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}
CACHE_ENTRIES = 256
PASS_THE_FILE = (
    "pass its config.json instead: params.config_json inline, or `vramlab plan --config "
    "./config.json` / `vramlab submit --config ./config.json`"
)


class HubUnavailable(ApiError):
    """The hub did not answer in time, or answered with its own failure: try again later
    (the spec is not at fault)."""

    status_code = 503
    type = "hub_unavailable"


@dataclass(frozen=True)
class HubId:
    repo: str  # owner/name
    revision: str  # "main" when the id names none

    @property
    def label(self) -> str:
        return f"{self.repo}@{self.revision}"


def names_hub_id(params: dict[str, Any]) -> bool:
    """Whether a model spec's ``model`` is meant as a hub id to fetch: a text with a '/'
    that is neither a preset's hub name (those map to presets and are never fetched) nor
    a model_type, with no ``config_json`` given (``model`` then only labels it)."""
    name = params.get("model")
    if params.get("config_json") is not None or not isinstance(name, str) or "/" not in name:
        return False
    return name not in HUB_NAMES and name not in PRESETS and not kinds_of(name)


def parse_hub_id(name: str) -> HubId:
    """``owner/name[@revision]`` checked strictly, or InvalidSpec naming what is allowed."""
    match = HUB_ID.fullmatch(name)
    if match is None or ".." in name or len(name) > MAX_TEXT:
        raise InvalidSpec(
            FIELD,
            f"{name[:120]!r} is not a hub id vramlab fetches: owner/name or "
            "owner/name@revision, each part letters, digits, '-', '_' and '.' (no '..'), "
            f"at most 96 characters a part, 64 for the revision and {MAX_TEXT} in all",
        )
    return HubId(match["repo"], match["revision"] or "main")


def resolve_params(
    params: dict[str, Any], settings: Settings, where: str = "params"
) -> dict[str, Any]:
    """``params`` with a hub id's config.json as ``config_json`` where ``model`` names one
    and no ``config_json`` is given; unchanged otherwise. InvalidSpec (422, its fields
    under ``where``) for an id that cannot be fetched here or whose document is refused;
    HubUnavailable (503) when the hub does not answer."""
    if not names_hub_id(params):
        return params
    try:
        return _resolved(params, settings)
    except InvalidSpec as exc:
        if where == "params":
            raise
        fields = [(where + d["field"][len("params") :], d["message"]) for d in exc.details]
        raise InvalidSpec(*fields[0], *fields[1:]) from None


def resolve_spec(
    spec: dict[str, Any],
    settings: Settings,
    where: str,
    changes: Sequence[tuple[str, Collection[str]]],
) -> dict[str, Any]:
    """A plan's, fit's or sweep's base ``spec`` with the hub id it names fetched as its
    ``config_json``; ``spec`` unchanged where it names none. ``changes``: what its
    variants (or grid) change, each as (the field to blame, the params keys it sets).
    They compare knobs of that one model: one that names a model of its own is refused,
    since the fetched config_json would win over it."""
    params = spec.get("params")
    if not isinstance(params, dict) or not names_hub_id(params):
        return spec
    for field, keys in changes:
        if "model" in keys or "config_json" in keys:
            raise InvalidSpec(
                field,
                "a base spec that names a hub id compares knobs of that model; ask about "
                "another model on its own",
            )
    return {**spec, "params": resolve_params(params, settings, where)}


def _resolved(params: dict[str, Any], settings: Settings) -> dict[str, Any]:
    name = str(params["model"])
    if not settings.hub_configs:
        raise InvalidSpec(
            FIELD,
            f"{name[:120]!r} looks like a hub id, and this service does not fetch hub "
            f"configs (VRAMLAB_HUB_CONFIGS=on turns it on, where the API has network); "
            f"{PASS_THE_FILE}",
        )
    hub_id = parse_hub_id(name)
    return {**params, "config_json": _CACHE.get(settings, hub_id)}


def fetch(settings: Settings, hub_id: HubId) -> dict[str, Any]:
    """The id's config.json from the hub, checked as an inline ``config_json``."""
    base = httpx.URL(settings.hub_url.rstrip("/") + "/")
    url = base.join(f"{hub_id.repo}/resolve/{hub_id.revision}/config.json")
    deadline = time.monotonic() + settings.hub_timeout_s
    body = _get(url, base, hub_id, settings, deadline)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidSpec(
            FIELD, f"the hub's config.json for {hub_id.label} is not JSON; {PASS_THE_FILE}"
        ) from None
    try:
        return check_document(document, "params.config_json")
    except CatalogError as exc:
        raise InvalidSpec(
            exc.field, f"{exc.message} (the config.json the hub serves for {hub_id.label})"
        ) from None


def _same_origin(url: httpx.URL, base: httpx.URL) -> bool:
    return (url.scheme, url.host, url.port) == (base.scheme, base.host, base.port)


def _get(
    url: httpx.URL, base: httpx.URL, hub_id: HubId, settings: Settings, deadline: float
) -> bytes:
    timeout = httpx.Timeout(settings.hub_timeout_s)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as http:
            for _ in range(MAX_REDIRECTS + 1):
                with http.stream("GET", url, headers=_HEADERS) as r:
                    if r.is_redirect:
                        url = url.join(r.headers.get("location", ""))
                        if not _same_origin(url, base):
                            raise InvalidSpec(
                                FIELD,
                                f"the hub sent {hub_id.label}'s config.json to another host "
                                f"({url.host}); only the hub's own answers are taken; "
                                f"{PASS_THE_FILE}",
                            )
                        continue
                    _check_status(r, hub_id)
                    return _read(r, hub_id, settings.hub_max_bytes, deadline)
    except httpx.TimeoutException:
        raise _unavailable(hub_id, f"did not answer within {settings.hub_timeout_s:g} s") from None
    except httpx.TransportError as exc:
        raise _unavailable(hub_id, f"could not be reached ({type(exc).__name__})") from None
    raise InvalidSpec(
        FIELD, f"the hub redirected {hub_id.label} more than {MAX_REDIRECTS} times; {PASS_THE_FILE}"
    )


def _unavailable(hub_id: HubId, why: str) -> HubUnavailable:
    return HubUnavailable(
        f"the model hub {why} while fetching {hub_id.label}'s config.json; try again, or "
        f"{PASS_THE_FILE}",
        headers={"Retry-After": "30"},
    )


def _check_status(r: httpx.Response, hub_id: HubId) -> None:
    code = r.status_code
    if code == 200:
        return
    if code in (401, 403):
        raise InvalidSpec(
            FIELD,
            f"{hub_id.repo} is gated or private on the hub (HTTP {code}); vramlab sends no "
            f"token; {PASS_THE_FILE}",
        )
    if code in (404, 410):
        raise InvalidSpec(
            FIELD,
            f"the hub has no config.json for {hub_id.repo} at revision {hub_id.revision} "
            f"(HTTP {code}): check the id and revision, or {PASS_THE_FILE}",
        )
    if code == 429 or code >= 500:
        raise _unavailable(hub_id, f"answered HTTP {code}")
    raise InvalidSpec(
        FIELD, f"the hub answered HTTP {code} for {hub_id.label}'s config.json; {PASS_THE_FILE}"
    )


def _read(r: httpx.Response, hub_id: HubId, cap: int, deadline: float) -> bytes:
    too_big = InvalidSpec(
        FIELD,
        f"the hub's config.json for {hub_id.label} is over {cap} bytes; a config.json is a "
        f"few KiB: {PASS_THE_FILE}",
    )
    declared = r.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise too_big
    chunks, size = [], 0
    for chunk in r.iter_raw():  # as sent: a compressed body is not expanded unbounded
        size += len(chunk)
        if size > cap:
            raise too_big
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the hub's answer came too slowly")
        chunks.append(chunk)
    if r.headers.get("content-encoding", "identity") not in ("identity", ""):
        raise InvalidSpec(
            FIELD, f"the hub's config.json for {hub_id.label} came encoded; {PASS_THE_FILE}"
        )
    return b"".join(chunks)


class _Cache:
    """Fetched documents by (hub, id, revision): bounded, thread-safe, a branch's entry
    kept for ``hub_cache_seconds``, a commit's until it is among the least recent."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self.lock = threading.Lock()
        self.items: OrderedDict[tuple[str, str, str], tuple[float, dict[str, Any]]] = OrderedDict()

    def get(self, settings: Settings, hub_id: HubId) -> dict[str, Any]:
        key = (settings.hub_url, hub_id.repo, hub_id.revision)
        now = time.monotonic()
        with self.lock:
            found = self.items.get(key)
            if found is not None and (found[0] > now or _COMMIT.fullmatch(hub_id.revision)):
                self.items.move_to_end(key)
                return copy.deepcopy(found[1])
        document = fetch(settings, hub_id)
        with self.lock:
            self.items[key] = (now + settings.hub_cache_seconds, document)
            self.items.move_to_end(key)
            while len(self.items) > self.entries:
                self.items.popitem(last=False)
        return copy.deepcopy(document)


_CACHE = _Cache()
