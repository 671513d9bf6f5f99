"""The ``vramlab fit``, ``fits``, ``fit-show`` and ``fit-cancel`` commands: what fits a
memory capacity, over HTTP (``/v1/fits``), like the other client commands."""

import argparse
import sys
from typing import Any

from vramlab import units
from vramlab.commands.common import client_of, param_value, reported
from vramlab.errors import ClientError
from vramlab.names import FIT_VARIES, FitStatus
from vramlab.render import print_json, progress_bar, size, status_line, table


def parse_bytes(text: str) -> int:
    """``24GiB``, ``80GB``, ``1.5 GiB`` or a number of bytes (a flag's type)."""
    try:
        return units.parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _overrides(text: str) -> dict[str, Any]:
    """``checkpointing=true,micro_batches=2``: one variant's param overrides."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, given = item.partition("=")
        if not eq or not key.strip():
            raise ClientError(f"--variant {text!r}: write KEY=VALUE[,KEY=VALUE...]")
        out[key.strip()] = param_value(key.strip(), given.strip())
    return out


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, given in (
        ("seq_len", args.seq),
        ("batch_size", args.batch),
        ("optimizer", args.optimizer),
        ("precision", args.precision),
    ):
        if given is not None:
            params[key] = given
    for item in args.param or []:
        params.update(_overrides(item))
    return params


def _progress(fit: dict[str, Any], _elapsed: float) -> None:
    status_line(_bar(fit))


def _bar(fit: dict[str, Any]) -> str:
    variants = fit["variants"]
    done = sum(v["state"] in ("done", "failed", "cancelled") for v in variants)
    trials = [t for v in variants for t in v["trials"]]
    running = sum(t["status"] in ("queued", "running") for t in trials)
    return progress_bar(done, len(variants), {"trials": len(trials), "waiting": running}).replace(
        f"{done}/{len(variants)}", f"{done}/{len(variants)} variants"
    )


def _max(v: dict[str, Any]) -> Any:
    """A variant's answer: its largest fitting value, "none" where even the smallest ran
    out of memory, blank while unknown."""
    if v["max_fitting"] is None and v["state"] == "done":
        return "none"
    return v["max_fitting"]


def show(fit: dict[str, Any]) -> None:
    vary = fit["vary"]
    model = fit["spec"].get("params", {}).get("model")
    where = f"{size(fit['capacity_bytes'])} ({fit['capacity_source']})"
    variants = fit["variants"]
    if variants and all(_max(v) == "none" for v in variants):
        # No answer to "the largest": say so, and what even the smallest needs.
        print(f"fit {fit['id']}: {fit['status']}: no {vary} of {model} fits {where}")
        for v in variants:
            print(f"  {v['note'] or 'none fits'}")
    else:
        print(f"fit {fit['id']}: {fit['status']}, the largest {vary} of {model} that fits {where}")
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
                _max(v),
                v["first_failing"],
                v["predicted_max_fitting"],
                "" if error is None else f"{error:+.2f}%",
                len(v["trials"]),
                v["error"] or v["note"] or "",
            )
        )
    headers = ["#", "variant", "state", f"max {vary}", "first failing", "predicted"]
    print(table([*headers, "prediction error", "trials", "note"], rows))


def cmd_fit(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        fit = client.fit(
            args.model,
            vary=args.vary,
            task=args.task,
            params=_params(args),
            variants=[_overrides(v) for v in args.variant or []],
            device=args.device,
            capacity_bytes=args.capacity,
            gpu=args.gpu,
            max_value=args.max,
        )
        if args.wait:
            fit = client.wait_fit(fit, args.poll, _progress)
            sys.stderr.write("\n")
    if args.json:
        print_json(fit)
    else:
        show(fit)
    return 0 if fit["status"] != FitStatus.FAILED else 1


def cmd_fits(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        page = client.fits(args.status, args.limit)
    if args.json:
        print_json(page)
        return 0
    rows = [
        (
            f["id"][:8],
            f["status"],
            f["model"],
            f["vary"],
            size(f["capacity_bytes"]),
            " ".join("-" if m is None else str(m) for m in f["max_fitting"]),
            f["created_at"][:19],
        )
        for f in page["items"]
    ]
    print(table(["id", "status", "model", "vary", "capacity", "max", "created"], rows))
    return 0


def cmd_fit_show(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        fit = client.fit_show(args.id)
        if args.wait:
            fit = client.wait_fit(fit, args.poll, _progress)
            sys.stderr.write("\n")
    if args.json:
        print_json(fit)
    else:
        show(fit)
    return 0


def cmd_fit_cancel(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        fit = client.fit_cancel(args.id)
    if args.json:
        print_json(fit)
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
    where.add_argument("--gpu", help="a live worker's GPU (by name): its memory")
    p.add_argument(
        "--variant",
        action="append",
        help="KEY=VALUE[,...]: one more search with these params (the spec as given is "
        "always the first); repeatable, e.g. --variant checkpointing=true",
    )
    p.add_argument("--max", type=int, help="search no higher than this value")
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=reported(cmd_fit))

    p = sub.add_parser("fits", parents=[common], help="list fit searches, newest first")
    p.add_argument("--status", choices=list(FitStatus))
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=reported(cmd_fits))

    p = sub.add_parser("fit-show", parents=[common], help="one fit search (id or prefix)")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=reported(cmd_fit_show))

    p = sub.add_parser("fit-cancel", parents=[common], help="cancel a fit and its trials")
    p.add_argument("id")
    p.set_defaults(func=reported(cmd_fit_cancel))
