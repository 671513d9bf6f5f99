"""The server's commands of ``vramlab``: serve the API, migrate, tokens, the predictor, or
the API and a local worker at once (``up``).

The ``vramlab`` script is the client's (``vramlab.cli``); this distribution adds these
commands to it through the ``vramlab.commands`` entry point group (``register``), as the
worker's adds ``worker``. ``python -m app.cli`` runs that whole command.
"""

import argparse
import copy
import importlib.util
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from app.core.config import get_settings

log = logging.getLogger("vramlab")


def _migrate(url: str) -> None:
    from app.core.migrate import upgrade

    upgrade(url)
    log.info("database schema is up to date")


def cmd_migrate(_: argparse.Namespace) -> int:
    _migrate(get_settings().database_url)
    return 0


CLAIM_PATH = "/v1/worker/claim"
HEALTH_PATHS = ("/readyz", "/healthz")


class RoutineCalls(logging.Filter):
    """Drops the access lines of calls that repeat all day and say nothing: a claim (single
    or batch) that found no work (204), which an idle worker makes again at once, one per
    long poll (``VRAMLAB_CLAIM_WAIT_SECONDS``); and a health check that passed, which the
    engine's or the cluster's probes make every few seconds. A failed one is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path and query, HTTP version, status).
        if isinstance(args, tuple) and len(args) == 5:
            path, status = str(args[2]), args[4]
            if path.startswith(CLAIM_PATH) and status == 204:
                return False
            if path in HEALTH_PATHS and isinstance(status, int) and 200 <= status < 300:
                return False
        return True


def _log_config(verbose: bool) -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    if not verbose:
        config.setdefault("filters", {})["routine_calls"] = {"()": RoutineCalls}
        config["loggers"]["uvicorn.access"]["filters"] = ["routine_calls"]
    return config


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    # The address really served decides whether tokens are required (`auto`), whatever
    # VRAMLAB_HOST said; `up` passes the token it made for its own worker.
    settings = get_settings().model_copy(
        update={"host": args.host, "local_worker_token": getattr(args, "local_worker_token", None)}
    )
    if not args.no_migrate:
        _migrate(settings.database_url)
    # Requests hop between the event loop and the thread pool a few times each; with the
    # default 5 ms GIL switch interval each hop can wait that long behind a busy thread,
    # and on SQLite the write slot is held meanwhile (docs/api-performance.md).
    sys.setswitchinterval(0.001)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=_log_config(getattr(args, "verbose", False)),
    )
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """The API with an embedded database and one local worker, in one command."""
    if importlib.util.find_spec("workers") is None:  # the worker's is another distribution
        log.error(
            "vramlab up runs a local worker: install the worker's distribution beside the "
            "server's (vramlab-worker; from a checkout: pip install './worker[models]'), or "
            "run `vramlab serve` and start workers elsewhere"
        )
        return 2
    # The predictor's children start with the API (unless the environment says not):
    # a newcomer's first model question is answered without waiting for their start.
    os.environ.setdefault("VRAMLAB_MODEL_PREDICTOR_START", "true")
    get_settings.cache_clear()
    settings = get_settings()
    _migrate(settings.database_url)
    # The worker reaches the API on loopback when it listens on every address.
    local = "127.0.0.1" if args.host in ("0.0.0.0", "", "::") else args.host
    api = f"http://[{local}]:{args.port}" if ":" in local else f"http://{local}:{args.port}"
    # Its own worker token (passed in the environment, not on the command line), so that
    # it can work wherever tokens are required without turning them on by itself.
    token = settings.worker_token or secrets.token_urlsafe(32)
    command = [sys.executable, "-m", "workers.cli", "--api", api, "--device", args.device]
    worker = subprocess.Popen(
        [*command, *(["--verbose"] if args.verbose else [])],
        env={**os.environ, "VRAMLAB_WORKER_TOKEN": token},
    )
    log.info("vramlab: API on %s (docs at %s/docs), database %s", api, api, settings.database_url)
    # uvicorn re-raises the signal that stopped it once it has shut down; with these
    # handlers restored under it, that re-raise returns here so the worker is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    leaving, died = threading.Event(), threading.Event()
    threading.Thread(target=_stop_if_worker_dies, args=(worker, leaving, died), daemon=True).start()
    try:
        serve = argparse.Namespace(
            host=args.host,
            port=args.port,
            no_migrate=True,
            log_level=args.log_level,
            verbose=args.verbose,
            local_worker_token=None if settings.worker_token else token,
        )
        code = cmd_serve(serve)
    finally:
        leaving.set()
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    return 1 if died.is_set() else code  # a dead worker: nothing ran the API's work


def _stop_if_worker_dies(
    worker: "subprocess.Popen[bytes]", leaving: threading.Event, died: threading.Event
) -> None:
    """`up` without its worker would accept work that nothing runs: stop the API too."""
    code = worker.wait()
    if leaving.is_set():
        return
    if code == 0:  # it was stopped (Ctrl-C reaches both processes): the API follows
        log.info("vramlab up: the worker stopped; stopping the API too")
    else:
        died.set()
        log.error(
            "vramlab up: the worker exited (code %s) before the API; stopping the API, since "
            "no worker would run what it accepts. The worker's log above says why.",
            code,
        )
    # Until uvicorn has its handlers in place a signal is ignored here: send until it stops.
    while not leaving.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        leaving.wait(1.0)


def cmd_token(args: argparse.Namespace) -> int:
    from app.access import tokens as auth
    from app.core.db import Database
    from app.tables.base import utcnow

    db = Database(get_settings().database_url)
    try:
        with db.session() as s:
            if args.action == "create":
                try:
                    row, plain = auth.create(
                        s, args.name, args.scope or ["read", "submit"], utcnow()
                    )
                except ValueError as exc:
                    print(f"vramlab token: {exc}", file=sys.stderr)
                    return 2
                print(plain)
                print(
                    f"token {row.id} ({row.name}; scopes: {', '.join(row.scopes)}): shown once, "
                    "store it now",
                    file=sys.stderr,
                )
            elif args.action == "list":
                for row in auth.list_all(s):
                    state = "revoked" if row.revoked_at else "active"
                    print(f"{row.id}  {state:<8} {','.join(row.scopes):<28} {row.name}")
            else:
                auth.revoke(s, args.id, utcnow())
                print(f"revoked {args.id}")
    finally:
        db.dispose()
    return 0


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the server's commands to ``vramlab`` (the ``vramlab.commands`` entry point)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        settings = get_settings()
    except ValidationError as exc:  # a bad environment variable: say which, not a traceback
        for line in settings_problems(exc):
            print(f"vramlab: {line}", file=sys.stderr)
        raise SystemExit(2) from None

    def server_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default=settings.host)
        p.add_argument("--port", type=int, default=settings.port)
        p.add_argument("--log-level", default="info")
        p.add_argument(
            "--verbose",
            action="store_true",
            help="log every request: an idle worker's empty claims (one per long poll) and "
            "passed health checks too",
        )

    p = sub.add_parser("serve", help="run the API")
    server_args(p)
    p.add_argument("--no-migrate", action="store_true", help="do not upgrade the schema first")
    p.set_defaults(func=cmd_serve)

    from app.experiments import predictor_service  # its children need torch; it does not

    predictor_service.add_parser(sub)

    p = sub.add_parser("migrate", help="upgrade the database schema (Alembic)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("token", help="create, list or revoke API tokens (stored hashed)")
    token_sub = p.add_subparsers(dest="action", required=True)
    create = token_sub.add_parser("create", help="print a new token once")
    create.add_argument(
        "--scope",
        action="append",
        choices=["read", "submit", "worker", "admin"],
        help="repeat for several (default: read and submit)",
    )
    create.add_argument("--name", default="token")
    token_sub.add_parser("list", help="tokens, their scopes and state")
    revoke = token_sub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("up", help="the API plus one local worker (CUDA if present, else CPU)")
    server_args(p)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.set_defaults(func=cmd_up)


def settings_problems(exc: ValidationError) -> list[str]:
    """A settings error as one line per variable: its name, what it was, what is allowed."""
    lines = []
    for error in exc.errors():
        name = "VRAMLAB_" + "_".join(str(p) for p in error["loc"]).upper()
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{name}={error.get('input')!s}: {message}")
    return lines


# Where no distribution is installed (a checkout on PYTHONPATH, as the GPU host runs the
# tests), ``python -m app.cli`` still has every command: these are what the server's and
# the worker's pyproject files declare in the ``vramlab.commands`` group.
CHECKOUT_COMMANDS = {"server": "app.cli:register", "worker": "workers.cli:register"}


def build_parser() -> argparse.ArgumentParser:
    """The whole ``vramlab`` command: the client's, the worker's, these."""
    from vramlab import cli

    return cli.build_parser(CHECKOUT_COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    from vramlab import cli

    return cli.main(argv, CHECKOUT_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
