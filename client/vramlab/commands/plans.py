"""The ``vramlab plan`` and ``vramlab gpus`` commands: will a model's step fit these GPUs,
predicted by the service (``/v1/plans``, nothing runs), and the GPU catalog it knows."""

import argparse
import sys
from typing import Any

from vramlab.commands.common import client_of, reported
from vramlab.commands.fits import _overrides, _params, parse_bytes
from vramlab.names import FIT_VARIES
from vramlab.render import print_json, size, table


def _fits(answer: dict[str, Any]) -> str:
    if answer["fits"] is None:
        return "?"
    headroom = answer["headroom_bytes"]
    return f"yes, {size(headroom)} spare" if answer["fits"] else f"NO, {size(-headroom)} short"


def show(plan: dict[str, Any]) -> None:
    vary = plan["vary"]
    params = plan["params"]
    print(
        f"plan (predicted for {plan['device']}, nothing ran): {plan['model']} "
        f"{params.get('task')}, batch {params.get('batch_size')} x seq {params.get('seq_len')}, "
        f"{params.get('precision')}, {params.get('optimizer')}"
    )
    rows = []
    for a in plan["answers"]:
        p = a["prediction"] or {}
        rows.append(
            (
                a["gpu"]["name"],
                size(a["gpu"]["usable_bytes"]),
                a["variant"]["label"],
                a["variant"]["value"],
                size(p.get("peak_allocated")),
                size(p.get("peak_reserved")),
                _fits(a),
                a["predicted_max_fitting"],
            )
        )
    headers = ["gpu", "usable", "variant", vary, "peak allocated", "peak reserved", "fits"]
    print(table([*headers, f"max {vary}"], rows))
    if plan["answers"] and plan["answers"][0]["prediction"]:
        cats = plan["answers"][0]["prediction"]["categories"]
        held = ", ".join(f"{k.replace('_', ' ')} {size(v)}" for k, v in cats.items() if v)
        print(f"\nat the peak ({plan['answers'][0]['variant']['label']}): {held}")
    if plan["suggestions"]:
        print("\nwhat would make it fit (most bytes saved first):")
        advice = [
            (
                s["label"],
                size(s["bytes_saved"]),
                size(s["peak_reserved"]),
                ", ".join(s["makes_fit"]) or "-",
                s["time_cost"] or "",
            )
            for s in plan["suggestions"]
        ]
        print(table(["change", "saves", "peak reserved", "then fits", "time cost"], advice))
    for card in plan.get("ways") or []:
        show_ways(card)
    for caveat in plan["caveats"][:1]:
        print(f"\n{caveat}")
    for caveat in plan["caveats"][1:]:
        if caveat.startswith("not ranked: "):  # a way the predictor refused
            print(caveat)


def count(n: int | None) -> str:
    """A parameter count as people say it: 124.4M, 8.03B, 786.4K."""
    if n is None:
        return "?"
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}" if n < 100 * scale else f"{n / scale:.0f}{unit}"
    return str(n)


def show_ways(card: dict[str, Any]) -> None:
    """One card's ways to fine-tune, best first."""
    print(
        f"\nways to fine-tune on {card['gpu']} ({size(card['usable_bytes'])} usable), best first:"
    )
    rows = [
        (
            w["rank"],
            w["label"],
            w["gpus"],
            size(w["peak_reserved"]) + (" per GPU" if w["gpus"] > 1 else ""),
            _fits(w),
            f"{count(w['trainable_parameters'])} of {count(w['parameters'])}",
            w["time_cost"] or "",
        )
        for w in card["ways"]
    ]
    headers = ["#", "way", "gpus", "peak reserved", "fits", "trains", "time cost"]
    print(table(headers, rows))
    for w in card["ways"]:  # a distributed row's note is its "per GPU"
        if w.get("note") and w["gpus"] == 1:
            print(f"  {w['rank']}: {w['note']}")


def cmd_plan(args: argparse.Namespace) -> int:
    if not args.gpu and args.capacity is None:
        print("vramlab: name a --gpu (see `vramlab gpus`) or a --capacity", file=sys.stderr)
        return 2
    with client_of(args) as client:
        plan = client.plan(
            args.model,
            gpus=args.gpu or [],
            capacity_bytes=args.capacity,
            vary=args.vary,
            task=args.task,
            params=_params(args),
            variants=[_overrides(v) for v in args.variant or []],
            suggest=not args.no_suggestions,
            verify=not args.quick,
        )
    if args.json:
        print_json(plan)
    else:
        show(plan)
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        items = client.gpus()["items"]
    if args.json:
        print_json(items)
        return 0
    rows = [
        (
            g["name"] + (" (worker)" if g["from_worker"] else ""),
            size(g["total_bytes"]),
            size(g["usable_bytes"]),
            g["usable_source"],
            g["compute_capability"],
            "yes" if g["bf16"] else "no",
            size(g["cublas_workspace_bytes"]),
        )
        for g in items
    ]
    headers = ["gpu", "total", "usable", "usable is", "sm", "bf16/flash", "cuBLAS ws"]
    print(table(headers, rows))
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "plan",
        parents=[common],
        help="will a model's step fit these GPUs: predicted, nothing runs, no worker needed",
    )
    p.add_argument("model", help="a preset (gpt2, llama-8b, tiny-gpt2) or a hub name")
    p.add_argument("--batch", type=int, help="batch_size")
    p.add_argument("--seq", type=int, help="seq_len")
    p.add_argument("--task", default="train", choices=["train", "inference", "generate"])
    p.add_argument("--optimizer")
    p.add_argument("--precision")
    p.add_argument("--param", action="append", help="KEY=VALUE[,...] more params (JSON values)")
    p.add_argument(
        "--gpu",
        action="append",
        help='a GPU by name, loosely ("RTX 4090", "h100", "A100 40GB"); repeatable',
    )
    p.add_argument("--capacity", type=parse_bytes, help="an emulated card, e.g. 24GiB or 80GB")
    p.add_argument(
        "--variant",
        action="append",
        help="KEY=VALUE[,...]: one more answer with these params, e.g. checkpointing=true",
    )
    p.add_argument("--vary", choices=list(FIT_VARIES), default="batch_size")
    p.add_argument(
        "--quick",
        action="store_true",
        help="read each edge off a curve through two or three traces, without tracing around "
        "it (faster; can be far off)",
    )
    p.add_argument("--no-suggestions", action="store_true", help="skip what would make it fit")
    p.set_defaults(func=reported(cmd_plan))

    p = sub.add_parser("gpus", parents=[common], help="the GPU catalog: usable memory per card")
    p.set_defaults(func=reported(cmd_gpus))
