"""``vramlab submit``, ``run``, ``show``, ``cancel`` and ``ls``: experiments, one at a
time. An experiment may be named by a unique prefix of its id (the 8 characters ``ls``
prints)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vramlab.client import Client
from vramlab.commands.common import client_of, isolation_arg, param_value, reported, wait_args
from vramlab.errors import ClientError, GaveUp
from vramlab.experiment_view import (
    describe,
    model_size,
    predicted_peak,
    prediction_lines,
    result_of,
    said,
    show_experiment,
)
from vramlab.names import Status
from vramlab.render import print_json, size, status_line, table


def _shape(text: str) -> list[int]:
    return [int(p) for p in text.replace("x", ",").split(",") if p.strip()]


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(Path(args.file).read_text()) if args.file else {}
    flags = {
        "op": args.op,
        "dtype": args.dtype,
        "device": args.device,
        "trace": args.trace,
        "repeat": args.repeat,
        "isolation": args.isolation,
    }
    spec.update({k: v for k, v in flags.items() if v is not None})
    if args.shape:
        spec["shape"] = _shape(args.shape)
    config = getattr(args, "config", None)
    if config:  # a model's own config.json, inline: the model is what it describes
        try:
            document = json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise ClientError(f"--config {config}: not a readable JSON file ({exc})") from None
        spec.setdefault("op", "model")
        spec.setdefault("params", {})["config_json"] = document
    for item in args.param or []:
        key, _, text = item.partition("=")
        spec.setdefault("params", {})[key] = param_value(key, text)
    if args.tag:
        spec["tags"] = [*spec.get("tags", []), *args.tag]
    if spec.get("op") == "model":
        spec.setdefault("shape", [])  # a model's sizes are its params (batch_size, seq_len)
    if "op" not in spec or "shape" not in spec:
        raise ClientError("a spec needs --op and --shape (or --file spec.json)")
    return spec


def _progress(exp: dict[str, Any], elapsed: float) -> None:
    detail = (exp.get("queue") or {}).get("reason") or ""
    status_line(f"{exp['id'][:8]} {said(exp)} {elapsed:5.1f}s {detail}")


def _waited(client: Client, exp: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    try:
        exp = client.wait(exp["id"], args.poll, args.give_up, _progress)
    except GaveUp:
        sys.stderr.write("\n")
        raise
    sys.stderr.write("\n")
    return exp


def _finish_submit(client: Client, exp: dict[str, Any], args: argparse.Namespace) -> int:
    if args.wait and not args.json and exp["spec"]["op"] == "model":
        # The answer to "will it fit" is known now: say it before the run, which may be long.
        print(f"{exp['id']}  {describe(exp['spec'])}")
        for line in prediction_lines(exp.get("prediction") or {}):
            print(line)
        print(flush=True)
    if args.wait:
        exp = _waited(client, exp, args)
    if args.json:
        print_json(exp)
    elif args.wait:
        show_experiment(exp)
    else:
        print(exp["id"])
    answered = exp["status"] == Status.SUCCEEDED or exp.get("expected_refusal")
    return 0 if not args.wait or answered else 1


def cmd_submit(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        return _finish_submit(client, client.submit(spec_of(args)), args)


def cmd_run(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"size": args.size}
    if args.device:
        body["device"] = args.device
    if args.dtype:
        body["dtype"] = args.dtype
    if args.isolation:
        body["isolation"] = args.isolation
    with client_of(args) as client:
        return _finish_submit(client, client.run_preset(args.preset, **body), args)


def cmd_cancel(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        exp = client.cancel(args.id)
    if args.json:
        print_json(exp)
    elif exp["status"] == Status.CANCELLED:
        print(f"{exp['id']} cancelled")
    else:
        print(f"{exp['id']} is {exp['status']}: its worker was asked to stop it")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        exp = client.show(args.id)
    if args.json:
        print_json(exp)
    else:
        show_experiment(exp)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        page = client.list(
            **{k: getattr(args, k) for k in ("status", "op", "device", "tag", "limit")}
        )
    if args.json:
        print_json(page)
        return 0
    rows = []
    for e in page["items"]:
        memory = (result_of(e) or {}).get("memory") or {}
        s = e["spec"]
        if s["op"] == "model":  # a model by its name, batch x length and precision
            p = s.get("params") or {}
            what = (f"model {p.get('model')}", model_size(s), p.get("precision"))
        else:
            what = (s["op"], "x".join(map(str, s["shape"])), s["dtype"])
        rows.append(
            (
                e["id"][:8],
                said(e),
                *what,
                s["device"],
                size(memory.get("delta_allocated")),
                size(memory.get("allocated_peak")),
                size(predicted_peak(e)),
                e["created_at"][:19],
            )
        )
    headers = ["id", "status", "op", "shape", "dtype", "device", "delta", "peak", "predicted"]
    print(table([*headers, "created"], rows))
    return 0


def register_submit(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("submit", parents=[common], help="submit an experiment")
    p.add_argument("--file", help="a spec as JSON (flags override its fields)")
    p.add_argument("--op")
    p.add_argument("--shape", help="e.g. 1000x1000")
    p.add_argument("--dtype")
    p.add_argument("--device")
    p.add_argument("--trace", choices=["none", "events", "stacks"])
    p.add_argument("--repeat", type=int)
    isolation_arg(p)
    p.add_argument("--param", action="append", help="KEY=VALUE (VALUE as JSON); repeatable")
    p.add_argument(
        "--config", help="a model's config.json (sent inline as params.config_json; op model)"
    )
    p.add_argument("--tag", action="append")
    wait_args(p)
    p.set_defaults(func=reported(cmd_submit))


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="run a preset (see `vramlab presets`)")
    p.add_argument("preset")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: what a live worker offers)")
    p.add_argument("--dtype")
    p.add_argument("--size", choices=["small", "medium", "large"], default="medium")
    isolation_arg(p)
    wait_args(p)
    p.set_defaults(func=reported(cmd_run))

    p = sub.add_parser("show", parents=[common], help="one experiment (id or unique prefix)")
    p.add_argument("id")
    p.set_defaults(func=reported(cmd_show))

    p = sub.add_parser("cancel", parents=[common], help="cancel a queued or running experiment")
    p.add_argument("id")
    p.set_defaults(func=reported(cmd_cancel))

    p = sub.add_parser("ls", parents=[common], help="list experiments, newest first")
    p.add_argument("--status", choices=list(Status))
    p.add_argument("--op")
    p.add_argument("--device")
    p.add_argument("--tag")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=reported(cmd_ls))
