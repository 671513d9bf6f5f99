"""Settings, read from the environment with the prefix ``VRAMLAB_``."""

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from vramlab import contract
from vramlab.units import parse_bytes

DEFAULT_SQLITE = Path("data") / "vramlab.db"


def normalise_database_url(url: str) -> str:
    """Pick vramlab's driver for a plain URL: psycopg 3 for PostgreSQL, pysqlite for SQLite."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _size(value: Any) -> Any:
    """A size as people write it (``200GiB``, ``80GB``, ``1048576``) in bytes; anything
    else is left for pydantic to refuse."""
    if isinstance(value, str):
        return parse_bytes(value)  # ValueError: pydantic reports it with the variable
    return value


# A number of bytes, given as such or with a unit.
Bytes = Annotated[int, BeforeValidator(_size)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VRAMLAB_", extra="ignore", populate_by_name=True)

    database_url: str = f"sqlite:///{DEFAULT_SQLITE}"
    host: str = "127.0.0.1"
    port: int = 8000
    # A claim is a lease: a worker that misses heartbeats for this long loses it.
    lease_seconds: float = 30.0
    # After this many claims whose leases expired, an experiment fails as `lost`.
    max_attempts: int = 3
    # How long a worker's claim call waits for work before it answers "nothing".
    claim_wait_seconds: float = 20.0
    # While a claim waits, how often it looks again (expired leases, other replicas).
    claim_poll_seconds: float = 2.0
    # How often the API itself settles expired leases (a background task).
    lease_check_seconds: float = Field(default=5.0, gt=0)
    # Fit searches step when a trial's outcome is stored, and this often as a catch-up.
    fit_check_seconds: float = Field(default=5.0, gt=0)
    # A worker counts as live while it was heard from within this long. Unset (0): until
    # it misses a heartbeat. A healthy worker is heard from at least every
    # `heartbeat_interval` (its lease's heartbeats while it runs, each look of its waiting
    # claim while it is idle): it is gone once two of them passed unheard, with room for
    # one call that waited for the database as long as any may (`db_wait_seconds`).
    worker_live_seconds: float = Field(default=0.0, ge=0)
    # The tensors a spec predicts (inputs and outputs) may not pass this many bytes.
    max_experiment_bytes: Bytes = 16 * 2**30
    max_timeout_s: float = 3600.0
    # Model experiments are predicted before they queue (app/experiments/predictor.py):
    # by a predictor service where its URL is set (deployments: the API image has no
    # torch), else by warm child processes of each API process (torch and transformers
    # beside the API; without them and without a URL, no prediction).
    model_predictions: bool = True
    predictor_url: str | None = None
    # The predictor service's bearer token (`vramlab predictor` requires it where set).
    predictor_token: str | None = None
    # Children per API process (or requests in flight to the service), and how much
    # lower than the API's their CPU priority is (nice).
    model_predictor_children: int = Field(default=2, ge=1, le=64)
    model_predictor_nice: int = Field(default=10, ge=0, le=19)
    # Start the children with the API, so that the first model question does not wait
    # for them to import torch and transformers (`vramlab up` turns it on; left off, they
    # start with the first model spec).
    model_predictor_start: bool = False
    # One prediction's limit in CPU seconds (a child's start, importing torch, is not
    # counted), how long a spec waits for a free child, and how many specs one submitter
    # may have waiting.
    model_predict_timeout_s: float = Field(default=5.0, gt=0)
    model_predict_wait_s: float = Field(default=30.0, gt=0)
    model_predict_per_submitter: int = Field(default=16, ge=1)
    # A model spec may name a hub id (owner/name[@revision]) whose config.json the API
    # fetches (app/catalog/hub.py): off by default, as the API then reaches the network.
    # The hub is VRAMLAB_HUB_URL, else HF_ENDPOINT (the hub's own convention), else
    # huggingface.co; a fetch's time-out, its largest body, and how long a branch's
    # config.json is kept before it is fetched again (a commit's is kept).
    hub_configs: bool = False
    hub_url: str = Field(
        default="https://huggingface.co",
        validation_alias=AliasChoices("VRAMLAB_HUB_URL", "HF_ENDPOINT"),
    )
    hub_timeout_s: float = Field(default=10.0, gt=0, le=120)
    hub_max_bytes: Bytes = Field(default=2**20, ge=1024, le=16 * 2**20)
    hub_cache_seconds: float = Field(default=3600.0, ge=0)
    max_repeat: int = 1000
    # Ops tagged `diagnostic` (sleep, abort) exist to test timeouts and crashes.
    diagnostic_ops: bool = False
    # Trace uploads: largest compressed chunk accepted, and its decompressed limit.
    max_trace_chunk_bytes: Bytes = contract.MAX_TRACE_CHUNK_BYTES
    max_trace_chunk_events: int = contract.MAX_TRACE_CHUNK_EVENTS
    # A shared worker token (the `worker` scope), for deployments such as docker compose.
    worker_token: str | None = None
    # The token `vramlab up` makes for its own worker; unlike worker_token it does not by
    # itself turn tokens on.
    local_worker_token: str | None = None
    # Until that worker has registered, a submit waits for it this long at most.
    local_worker_start_s: float = Field(default=60.0, ge=0)
    # "auto": auth is on when the address served is beyond loopback (`--host` of `serve`
    # and `up`), with a worker token set, or once any API token exists; "on" and "off"
    # force it.
    auth: Literal["auto", "on", "off"] = "auto"
    # With no token required, only requests for these host names are answered (others get
    # 403): a web page cannot reach the open service by pointing its own name at
    # 127.0.0.1 (DNS rebinding). "*.localhost" matches any subdomain; "*" any name.
    open_hosts: list[str] = ["localhost", "127.0.0.1", "::1", "*.localhost"]
    # The web pages' sign-in: how long it lasts, and the key that signs it (random at each
    # start when unset; set one shared key for several API replicas).
    session_seconds: int = Field(default=12 * 3600, ge=60, le=30 * 86400)
    session_secret: str | None = None
    # Submitters without the admin scope may set `priority` up to this (0: only admins
    # may put work ahead of the queue; anyone may lower their own).
    max_priority: int = Field(default=0, ge=-100, le=100)
    # When tokens are required, GET /metrics needs one too (any scope).
    metrics_need_token: bool = False
    # Queued experiments one token (or the open service) may have at once; past it, 429.
    max_queued_per_token: int = 10_000
    # Request bodies larger than this get 413 (trace chunks have their own limit).
    max_body_bytes: Bytes = contract.MAX_OUTCOME_BYTES
    # Memory snapshot uploads (POST /v1/snapshots): the largest body, and the largest
    # pickle a gzipped one may expand to; both admit 2 GiB snapshots by default.
    max_snapshot_bytes: Bytes = 3 * 2**30
    max_snapshot_expanded_bytes: Bytes = 3 * 2**30
    # How many times its own size a gzipped upload may expand to, checked as it arrives
    # (past the first MiB expanded): a gzip bomb is refused within its first kilobytes.
    max_snapshot_gzip_ratio: int = Field(default=200, ge=1, le=10_000)
    # The child process that parses a snapshot: its address-space limit and its time.
    snapshot_parse_memory_bytes: Bytes = 16 * 2**30
    snapshot_parse_seconds: float = 600.0
    # Imports parsed at once (each may hold several GiB while it parses); an upload whose
    # body has been read waits its turn, up to snapshot_parse_seconds, then gets 429.
    snapshot_imports_at_once: int = Field(default=1, ge=1)
    # Uploads in flight at once (read, waiting for the import slot, or imported), and of
    # one submitter (its token; its address when tokens are off); past either, 429 at
    # once, before the body is read. Each holds a temp file of up to max_snapshot_bytes.
    snapshot_uploads_at_once: int = Field(default=8, ge=1)
    snapshot_uploads_per_submitter: int = Field(default=2, ge=1)
    # The body must come at this rate at least, over each window of this many seconds
    # (a body that brings less is cut with 408), so that a trickle holds nothing long.
    snapshot_upload_min_bytes_per_second: Bytes = Field(default=64 * 2**10, ge=1)
    snapshot_upload_window_seconds: float = Field(default=30.0, gt=0)
    # Database connections of this process: at most pool + overflow at once (unset: 5 + 40
    # on SQLite, where connections are cheap and writers queue on an in-process lock;
    # 10 + 10 on PostgreSQL, whose server has a connection budget: see docs/design.md).
    db_pool_size: int | None = Field(default=None, ge=1, le=1000)
    db_max_overflow: int | None = Field(default=None, ge=0, le=1000)
    # Longest a request waits for a connection or SQLite's write slot; then 503.
    db_wait_seconds: float = Field(default=5.0, gt=0, le=60)
    # Origins allowed by CORS; none by default.
    cors_origins: list[str] = []

    @model_validator(mode="after")
    def _live_until_a_missed_heartbeat(self) -> "Settings":
        if not self.worker_live_seconds:
            self.worker_live_seconds = 2 * self.heartbeat_interval + self.db_wait_seconds
        return self

    @field_validator("hub_url")
    @classmethod
    def _hub_origin(cls, url: str) -> str:
        parsed = urlsplit(url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("the hub's URL must be http(s)://host[:port][/path]")
        if parsed.query or parsed.fragment or parsed.username or parsed.password:
            raise ValueError("the hub's URL takes no query, fragment or credentials")
        return url.strip().rstrip("/")

    @field_validator("database_url")
    @classmethod
    def _normalise(cls, url: str) -> str:
        return normalise_database_url(url)

    @property
    def heartbeat_seconds(self) -> float:
        """How often a worker heartbeats a running experiment's lease: often enough that a
        cancel reaches it within about 2 s, and several times per lease."""
        return max(0.2, min(self.lease_seconds / 3, 2.0))

    @property
    def heartbeat_interval(self) -> float:
        """The longest a healthy worker stays unheard: between its lease's heartbeats
        while it runs, between its waiting claim's looks while it is idle."""
        return max(self.heartbeat_seconds, self.claim_poll_seconds)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def pool(self) -> tuple[int, int]:
        """Pool size and overflow for this engine."""
        size, overflow = (5, 40) if self.is_sqlite else (10, 10)
        return (
            self.db_pool_size if self.db_pool_size is not None else size,
            self.db_max_overflow if self.db_max_overflow is not None else overflow,
        )


@lru_cache
def get_settings() -> Settings:
    return Settings()
