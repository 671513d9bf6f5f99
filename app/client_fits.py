"""The ``vramlab fit``, ``fits``, ``fit-show`` and ``fit-cancel`` commands: what fits a
memory capacity, over HTTP (``/v1/fits``), like the other client commands."""

import argparse
import re
import sys
import time
from typing import Any

import httpx
from vramlab.contract import FIT_VARIES, FitStatus

from app import client_cli as cli

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """``24GiB``, ``80GB``, ``1.5 GiB`` or a number of bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write e.g. 24GiB, 80GB or a number of bytes"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def _overrides(text: str) -> dict[str, Any]:
    """``checkpointing=true,micro_batches=2``: one variant's param overrides."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise cli.ClientError(f"--variant {text!r}: write KEY=VALUE[,KEY=VALUE...]")
        out[key.strip()] = cli._value(value.strip())
    return out


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"model": args.model, "task": args.task}
    for key, value in (
        ("seq_len", args.seq),
        ("batch_size", args.batch),
        ("optimizer", args.optimizer),
        ("precision", args.precision),
    ):
        if value is not None:
            params[key] = value
    for item in args.param or []:
        params.update(_overrides(item))
    spec: dict[str, Any] = {"op": "model", "shape": [], "params": params}
    if args.device:
        spec["device"] = args.device
    body: dict[str, Any] = {
        "spec": spec,
        "vary": args.vary,
        "variants": [{}, *(_overrides(v) for v in args.variant or [])],
    }
    if args.capacity is not None:
        body["capacity_bytes"] = args.capacity
    if args.gpu:
        body["requirements"] = {"gpu_name": args.gpu}
    if args.max is not None:
        body["max_value"] = args.max
    return body


def _progress(fit: dict[str, Any]) -> str:
    variants = fit["variants"]
    done = sum(v["state"] in ("done", "failed", "cancelled") for v in variants)
    trials = [t for v in variants for t in v["trials"]]
    running = sum(t["status"] in ("queued", "running") for t in trials)
    return cli._progress_bar(
        done, len(variants), {"trials": len(trials), "waiting": running}
    ).replace(f"{done}/{len(variants)}", f"{done}/{len(variants)} variants")


def show(fit: dict[str, Any]) -> None:
    vary = fit["vary"]
    print(
        f"fit {fit['id']}: {fit['status']}, the largest {vary} of "
        f"{fit['spec'].get('params', {}).get('model')} that fits "
        f"{cli._bytes(fit['capacity_bytes'])} ({fit['capacity_source']})"
    )
    if fit.get("error"):
        print(f"  {fit['error']}")
    rows = []
    for v in fit["variants"]:
        error = v["prediction_error"]
        rows.append(
            (
                v["index"],
                ", ".join(f"{k}={val}" for k, val in v["overrides"].items()) or "as given",
                v["state"],
                v["max_fitting"],
                v["first_failing"],
                v["predicted_max_fitting"],
                "" if error is None else f"{error:+.2f}%",
                len(v["trials"]),
                v["error"] or v["note"] or "",
            )
        )
    headers = ["#", "variant", "state", f"max {vary}", "first failing", "predicted"]
    print(cli.table([*headers, "prediction error", "trials", "note"], rows))


def _wait(client: httpx.Client, fit: dict[str, Any], poll: float) -> dict[str, Any]:
    while not FitStatus(fit["status"]).finished:
        time.sleep(poll)
        fit = cli._check(client.get(f"/v1/fits/{fit['id']}"))
        cli._status_line(_progress(fit))
    sys.stderr.write("\n")
    return fit


def cmd_fit(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        fit = cli._check(client.post("/v1/fits", json=body_of(args)))
        if args.wait:
            fit = _wait(client, fit, args.poll)
    if args.json:
        cli._print_json(fit)
    else:
        show(fit)
    return 0 if fit["status"] != FitStatus.FAILED else 1


def cmd_fits(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        params: dict[str, Any] = {"limit": args.limit}
        if args.status:
            params["status"] = args.status
        page = cli._check(client.get("/v1/fits", params=params))
    if args.json:
        cli._print_json(page)
        return 0
    rows = [
        (
            f["id"][:8],
            f["status"],
            f["model"],
            f["vary"],
            cli._bytes(f["capacity_bytes"]),
            " ".join("-" if m is None else str(m) for m in f["max_fitting"]),
            f["created_at"][:19],
        )
        for f in page["items"]
    ]
    print(cli.table(["id", "status", "model", "vary", "capacity", "max", "created"], rows))
    return 0


def cmd_fit_show(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        fit = cli._check(client.get(f"/v1/fits/{args.id}"))
        if args.wait:
            fit = _wait(client, fit, args.poll)
    if args.json:
        cli._print_json(fit)
    else:
        show(fit)
    return 0


def cmd_fit_cancel(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        fit = cli._check(client.post(f"/v1/fits/{args.id}/cancel"))
    if args.json:
        cli._print_json(fit)
    else:
        print(f"fit {fit['id']}: {fit['status']}")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "fit",
        parents=[common],
        help="the largest batch size or sequence length of a model that fits a capacity",
    )
    p.add_argument("model", help="a preset (tiny-gpt2) or a hub name (gpt2)")
    p.add_argument("--seq", type=int, help="seq_len")
    p.add_argument("--batch", type=int, help="batch_size (the start when no prediction)")
    p.add_argument("--task", default="train", choices=["train", "inference", "generate"])
    p.add_argument("--optimizer")
    p.add_argument("--precision")
    p.add_argument("--device", help="cpu or cuda (default: what a live worker offers)")
    p.add_argument("--param", action="append", help="KEY=VALUE[,...] more params (JSON values)")
    p.add_argument("--vary", choices=list(FIT_VARIES), default="batch_size")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--capacity", type=parse_bytes, help="e.g. 24GiB")
    where.add_argument("--gpu", help="a registered worker's GPU (by name): its memory")
    p.add_argument(
        "--variant",
        action="append",
        help="KEY=VALUE[,...]: one more search with these params (the spec as given is "
        "always the first); repeatable, e.g. --variant checkpointing=true",
    )
    p.add_argument("--max", type=int, help="search no higher than this value")
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cli._run(cmd_fit))

    p = sub.add_parser("fits", parents=[common], help="list fit searches, newest first")
    p.add_argument("--status", choices=list(FitStatus))
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=cli._run(cmd_fits))

    p = sub.add_parser("fit-show", parents=[common], help="one fit search (id or prefix)")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cli._run(cmd_fit_show))

    p = sub.add_parser("fit-cancel", parents=[common], help="cancel a fit and its trials")
    p.add_argument("id")
    p.set_defaults(func=cli._run(cmd_fit_cancel))
