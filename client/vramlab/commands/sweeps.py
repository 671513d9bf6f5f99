"""``vramlab sweep`` (a grid of experiments, with a progress bar and a table of its
points) and ``vramlab compare`` (experiments side by side)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vramlab.commands.common import client_of, isolation_arg, reported, value
from vramlab.errors import ClientError
from vramlab.names import FINISHED
from vramlab.render import cell, figure, print_json, progress_bar, size, status_line, table


def _progress(sweep: dict[str, Any], _elapsed: float) -> None:
    counts = sweep["progress"]
    done = sum(counts[k] for k in FINISHED)
    status_line(progress_bar(done, sweep["n_points"], counts))


def cmd_sweep(args: argparse.Namespace) -> int:
    body: dict[str, Any] = json.loads(Path(args.file).read_text()) if args.file else {}
    if args.spec:
        body["spec"] = json.loads(Path(args.spec).read_text())
    for item in args.grid or []:
        key, _, values = item.partition("=")
        body.setdefault("grid", {})[key] = [value(v) for v in values.split(";")]
    if "spec" not in body or "grid" not in body:
        raise ClientError("a sweep needs a spec and a grid: --file sweep.json or --spec + --grid")
    if args.isolation:
        body["spec"] = {**body["spec"], "isolation": args.isolation}
    with client_of(args) as client:
        sweep = client.sweep(body.pop("spec"), body.pop("grid"), **body)
        if args.wait:
            sweep = client.wait_sweep(sweep, args.poll, _progress)
            sys.stderr.write("\n")
        if args.csv:
            Path(args.csv).write_text(client.sweep_csv(sweep["id"]))
    if args.json:
        print_json(sweep)
        return 0
    print(f"sweep {sweep['id']}: {sweep['n_points']} points")
    keys = list(sweep["grid"])
    rows = [
        (
            r["index"],
            *(cell(r["values"].get(k)) for k in keys),
            r["status"] if r.get("error_type") is None else f"{r['status']}: {r['error_type']}",
            size(r.get("delta_allocated")),
            size(r.get("allocated_peak")),
            size(r.get("predicted_delta")),
            figure("time_s", r.get("time_s")),
        )
        for r in sweep["rows"]
    ]
    print(table(["#", *keys, "status", "delta", "peak", "predicted", "time"], rows))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        out = client.compare(args.ids)
    if args.json:
        print_json(out)
        return 0
    items = out["items"]
    headers = ["figure", *(i["label"] for i in items)]
    rows = []
    for key in items[0]["figures"]:
        row = [key]
        for n, item in enumerate(items):
            found, diff = item["figures"][key], out["differences"][key][n]
            text = figure(key, found)
            if n and diff:
                text += f" ({'+' if diff > 0 else '-'}{figure(key, abs(diff))})"
            row.append(text)
        rows.append(row)
    print(table(headers, rows))
    _models_side_by_side(out, headers)
    for key, values in out["environment"].items():
        shown = ("not recorded" if v is None else repr(v) if v == "" else str(v) for v in values)
        print(f"environment {key}: {' | '.join(shown)}")
    return 0


MODEL_KNOBS = (
    "model",
    "task",
    "batch_size",
    "seq_len",
    "image_size",
    "precision",
    "optimizer",
    "checkpointing",
    "micro_batches",
    "predicted_for",
)


def _models_side_by_side(out: dict[str, Any], headers: list[str]) -> None:
    """Model experiments: the knobs that set their size, then what held memory at the
    peak (measured, with the prediction beside it), one column each."""
    items = out["items"]
    models = [i.get("model") or {} for i in items]
    if not any(models):
        return
    rows = [
        [key, *("" if m.get(key) is None else str(m.get(key)) for m in models)]
        for key in MODEL_KNOBS
        if any(m.get(key) is not None for m in models)
    ]
    print()
    print(table(["model", *headers[1:]], rows))
    measured = out.get("categories") or {}
    predicted = out.get("predicted_categories") or {}
    names = list(dict.fromkeys([*measured, *predicted]))
    if not names:
        return
    rows = []
    for name in names:
        row = [name.replace("_", " ")]
        for n in range(len(items)):
            got = (measured.get(name) or [None] * len(items))[n]
            guess = (predicted.get(name) or [None] * len(items))[n]
            text = size(got) if got is not None else ""
            if guess is not None:
                text += f" (predicted {size(guess)})" if text else f"predicted {size(guess)}"
            row.append(text)
        rows.append(row)
    print("\nat the peak, by category:")
    print(table(["category", *headers[1:]], rows))


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("sweep", parents=[common], help="queue a grid of experiments")
    p.add_argument("--file", help='JSON {"spec": {...}, "grid": {...}}')
    p.add_argument("--spec", help="a spec as a JSON file")
    p.add_argument(
        "--grid",
        action="append",
        help='KEY=V1;V2;... (values as JSON), e.g. \'dtype="float32";"float16"\'',
    )
    isolation_arg(p)
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--csv", help="write the table as CSV to this file")
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    p.set_defaults(func=reported(cmd_sweep))

    p = sub.add_parser("compare", parents=[common], help="experiments side by side")
    p.add_argument("ids", nargs="+")
    p.set_defaults(func=reported(cmd_compare))
