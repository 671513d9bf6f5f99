"""The ``vramlab`` client commands: submit, show, ls, cancel, trace, sweep, compare,
presets and run.

They speak the HTTP API (httpx), so they work against a remote service: the server from
``--api`` or ``VRAMLAB_API_URL``, a token from ``--token`` or ``VRAMLAB_TOKEN``. Tables
for people; ``--json`` for scripts. Status lines and progress bars go to stderr. An
experiment may be named by a unique prefix of its id (the 8 characters ``ls`` prints).
"""

import argparse
import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from vramlab.contract import FINISHED, Isolation, Result, SnapshotResult, Status

from app.core.units import human_bytes
from app.sweeps.schemas import SweepRow

TERMINAL = tuple(str(s) for s in Status if s in FINISHED)
FULL_ID = 36


class ClientError(Exception):
    """A failure to report in one line, with exit status 1."""


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    return httpx.Client(base_url=args.api, headers=headers, timeout=60)


def _check(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json() if "json" in response.headers.get("content-type", "") else None
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:500]
    raise ClientError(f"{response.status_code}: {message}")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _bytes(n: Any) -> str:
    return human_bytes(n) if isinstance(n, int | float) else ""


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _status_line(text: str) -> None:
    sys.stderr.write("\r\033[K" + text)
    sys.stderr.flush()


class GaveUp(ClientError):
    """``--wait`` stopped waiting: no live worker can run the experiment."""


def _wait(client: httpx.Client, exp_id: str, poll_s: float, give_up_s: float) -> dict[str, Any]:
    """Poll until the experiment has finished. Give up once no live worker has been able
    to run it for ``give_up_s`` seconds (queued work that a busy worker will reach is
    waited for)."""
    started = time.monotonic()
    stuck_since: float | None = None
    while True:
        exp: dict[str, Any] = _check(client.get(f"/v1/experiments/{exp_id}"))
        now = time.monotonic()
        queue = exp.get("queue") or {}
        detail = queue.get("reason") or ""
        _status_line(f"{exp_id[:8]} {_said(exp)} {now - started:5.1f}s {detail}")
        if exp["status"] in TERMINAL:
            sys.stderr.write("\n")
            return exp
        if exp["status"] == Status.QUEUED and queue.get("runnable") is False:
            stuck_since = now if stuck_since is None else stuck_since
            if now - stuck_since >= give_up_s:
                sys.stderr.write("\n")
                raise GaveUp(
                    f"gave up waiting for {exp_id[:8]} after {now - started:.0f}s: {detail}. "
                    f"It stays queued; `vramlab cancel {exp_id[:8]}` removes it"
                )
        else:
            stuck_since = None
        time.sleep(poll_s)


def resolve_id(client: httpx.Client, given: str) -> str:
    """A full experiment id from a unique prefix of one (as ``ls`` and the pages print)."""
    if len(given) >= FULL_ID:
        return given
    if not given or any(c not in "0123456789abcdefABCDEF-" for c in given):
        raise ClientError(f"{given!r} is not an experiment id nor the start of one")
    page = _check(client.get("/v1/experiments", params={"id_prefix": given, "limit": 10}))
    ids = [item["id"] for item in page["items"]]
    if not ids:
        raise ClientError(f"no experiment id starts with {given!r}")
    if len(ids) > 1:
        listing = ", ".join(i for i in ids) + (" …" if page.get("next_cursor") else "")
        raise ClientError(f"{given!r} matches several experiments: {listing}; give more of it")
    return str(ids[0])


def _shape(text: str) -> list[int]:
    return [int(p) for p in text.replace("x", ",").split(",") if p.strip()]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _spec(args: argparse.Namespace) -> dict[str, Any]:
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
    for item in args.param or []:
        key, _, value = item.partition("=")
        spec.setdefault("params", {})[key] = _value(value)
    if args.tag:
        spec["tags"] = [*spec.get("tags", []), *args.tag]
    if spec.get("op") == "model":
        spec.setdefault("shape", [])  # a model's sizes are its params (batch_size, seq_len)
    if "op" not in spec or "shape" not in spec:
        raise ClientError("a spec needs --op and --shape (or --file spec.json)")
    return spec


def _said(exp: dict[str, Any]) -> str:
    """The status as the API words it for people (an expected refusal as the answer)."""
    return str(exp.get("status_line") or exp["status"])


def show_experiment(exp: dict[str, Any]) -> None:
    spec = exp["spec"]
    print(f"{exp['id']}  {_said(exp)}  {_describe(spec)}")
    for note in exp.get("preset_notes") or []:
        print(f"note: {note}")
    if exp.get("error"):
        said = "PyTorch's refusal" if exp.get("expected_refusal") else "error"
        print(f"{said}: {exp['error']['type']}: {exp['error']['message']}")
    result = _result(exp)
    if result is None:
        return
    prediction = exp.get("prediction") or {}
    if spec["op"] == "model":  # a model's prediction is its step's peak, not an op's figures
        figures = {"allocated_peak": "peak_allocated", "reserved_peak": "peak_reserved"}
        prediction = {
            **{k: prediction.get(v) for k, v in figures.items()},
            "peak_allocated": prediction.get("peak_allocated"),
            "categories": prediction.get("categories"),
        }
    shared = result.shared_process_figures() if isinstance(result, Result) else ()
    rows = [
        (f"{k} †" if k in shared else k, _bytes(v), v, _bytes(prediction.get(k)))
        for k, v in result.memory.model_dump().items()
    ]
    print(table(["figure", "measured", "bytes", "predicted"], rows))
    if shared:
        print(
            "† a shared-process figure: it starts from what earlier experiments left in the "
            "shared process, so it depends on that history (--isolation clean: this alone)"
        )
    if isinstance(result, Result) and result.model is not None:
        _show_model(result, prediction)
    for note in result.notes if isinstance(result, Result) else []:
        print(f"- {note}")


def _show_model(result: Result, prediction: dict[str, Any]) -> None:
    """A model experiment: its steps' phases, and what held memory at the reported peak."""
    figures = result.model
    assert figures is not None
    print(
        f"\n{figures.model} ({figures.model_type}, {figures.parameter_count:,} parameters): "
        f"{figures.task}, step {figures.reported_step} peaked at "
        f"{_bytes(figures.peak_allocated)} allocated, {_bytes(figures.peak_reserved)} reserved"
    )
    phases = [
        (
            s.step,
            ph.name,
            _bytes(ph.peak_allocated),
            _bytes(ph.peak_reserved),
            f"{ph.wall_s:.3g}" if ph.wall_s is not None else "",
        )
        for s in figures.steps
        for ph in s.phases
    ]
    print(table(["step", "phase", "peak allocated", "peak reserved", "seconds"], phases))
    predicted = prediction.get("categories") or {}
    if result.categories is not None:
        peak = figures.peak_allocated or 1
        rows = [
            (k.replace("_", " "), _bytes(v), f"{100 * v / peak:.0f}%", _bytes(predicted.get(k)))
            for k, v in result.categories.model_dump().items()
            if v or predicted.get(k)
        ]
        rows.append(
            ("total", _bytes(figures.peak_allocated), "", _bytes(prediction.get("peak_allocated")))
        )
        print(f"\nat step {figures.reported_step}'s peak, by category:")
        print(table(["category", "measured", "share", "predicted"], rows))
    if figures.time_per_step_s:
        speed = f"{figures.time_per_step_s:.3g} s a step"
        if figures.tokens_per_s:
            speed += f", {figures.tokens_per_s:,.0f} tokens/s"
        elif figures.samples_per_s:
            speed += f", {figures.samples_per_s:,.1f} samples/s"
        print(speed)


def _describe(spec: dict[str, Any]) -> str:
    """A spec in a few words: a model experiment by its model and knobs."""
    if spec["op"] == "model":
        p = spec.get("params") or {}
        size = f" x {p['seq_len']}" if p.get("seq_len") else ""
        return (
            f"{p.get('model')} {p.get('task')} batch {p.get('batch_size')}{size} "
            f"{p.get('precision')} {spec['device']}"
        )
    return f"{spec['op']} {'x'.join(map(str, spec['shape']))} {spec['dtype']} {spec['device']}"


def _result(exp: dict[str, Any]) -> Result | SnapshotResult | None:
    if not exp.get("result"):
        return None
    model = SnapshotResult if exp.get("kind") == "snapshot" else Result
    return model.model_validate(exp["result"])


def _finish_submit(client: httpx.Client, exp: dict[str, Any], args: argparse.Namespace) -> int:
    if args.wait:
        exp = _wait(client, exp["id"], args.poll, args.give_up)
    if args.json:
        _print_json(exp)
    elif args.wait:
        show_experiment(exp)
    else:
        print(exp["id"])
    answered = exp["status"] == Status.SUCCEEDED or exp.get("expected_refusal")
    return 0 if not args.wait or answered else 1


def cmd_submit(args: argparse.Namespace) -> int:
    with _client(args) as client:
        exp = _check(client.post("/v1/experiments", json=_spec(args)))
        return _finish_submit(client, exp, args)


def cmd_run(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"size": args.size}
    if args.device:
        body["device"] = args.device
    if args.dtype:
        body["dtype"] = args.dtype
    if args.isolation:
        body["isolation"] = args.isolation
    with _client(args) as client:
        exp = _check(client.post(f"/v1/presets/{args.preset}/runs", json=body))
        return _finish_submit(client, exp, args)


def cmd_presets(args: argparse.Namespace) -> int:
    with _client(args) as client:
        listing = _check(client.get("/v1/presets"))
    if args.json:
        _print_json(listing)
        return 0
    names = max([len("preset"), *(len(p["name"]) for p in listing)])
    # The question wraps at word boundaries to what the terminal has left, never cut.
    room = max(30, shutil.get_terminal_size((120, 24)).columns - names - len("device") - 5)
    rows: list[tuple[str, str, str]] = []
    for p in listing:
        lines = textwrap.wrap(p["question"], room, break_on_hyphens=False) or [""]
        rows.append((p["name"], _preset_device(p), lines[0]))
        rows += [("", "", more) for more in lines[1:]]
    print(table(["preset", "device", "question"], rows))
    if any(p.get("gpu_question") for p in listing):
        print(
            "\n* a question about the GPU: on the CPU it runs, and says that it does not answer it",
            file=sys.stderr,
        )
    print("\nrun one: vramlab run PRESET [--device cpu|cuda] [--wait]", file=sys.stderr)
    return 0


def _preset_device(preset: dict[str, Any]) -> str:
    if preset["needs_cuda"]:
        return "cuda"
    return "cuda*" if preset.get("gpu_question") else "any"


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        exp_id = resolve_id(client, args.id)
        exp = _check(client.post(f"/v1/experiments/{exp_id}/cancel"))
    if args.json:
        _print_json(exp)
    elif exp["status"] == Status.CANCELLED:
        print(f"{exp_id} cancelled")
    else:
        print(f"{exp_id} is {exp['status']}: its worker was asked to stop it")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        exp = _check(client.get(f"/v1/experiments/{resolve_id(client, args.id)}"))
    if args.json:
        _print_json(exp)
    else:
        show_experiment(exp)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    params = {k: getattr(args, k) for k in ("status", "op", "device", "tag", "limit")}
    with _client(args) as client:
        page = _check(client.get("/v1/experiments", params={k: v for k, v in params.items() if v}))
    if args.json:
        _print_json(page)
        return 0
    rows = []
    for e in page["items"]:
        result = _result(e)
        s = e["spec"]
        rows.append(
            (
                e["id"][:8],
                _said(e),
                s["op"],
                "x".join(map(str, s["shape"])),
                s["dtype"],
                s["device"],
                _bytes(result.memory.delta_allocated if result else None),
                _bytes(result.memory.allocated_peak if result else None),
                e["created_at"][:19],
            )
        )
    print(
        table(["id", "status", "op", "shape", "dtype", "device", "delta", "peak", "created"], rows)
    )
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    to_file = args.output not in (None, "-")
    with _client(args) as client, ExitStack() as stack:
        exp_id = resolve_id(client, args.id)
        out = stack.enter_context(Path(args.output).open("wb")) if to_file else sys.stdout.buffer
        _download(client, f"/v1/experiments/{exp_id}/trace", args.format, out)
    if to_file:
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    return 0


def _download(client: httpx.Client, url: str, fmt: str, out: BinaryIO) -> None:
    if fmt == "json":
        # The JSON form pages; write every page into one array as it arrives.
        out.write(b"[")
        offset: int | None = 0
        first = True
        while offset is not None:
            page = _check(
                client.get(url, params={"format": "json", "offset": offset, "limit": 10_000})
            )
            for event in page["events"]:
                out.write((b"" if first else b",\n") + json.dumps(event).encode())
                first = False
            offset = page["next_offset"]
        out.write(b"]\n")
        return
    with client.stream("GET", url, params={"format": fmt}) as response:
        if not response.is_success:
            response.read()
            _check(response)
        for block in response.iter_bytes():
            out.write(block)


def _progress_bar(done: int, total: int, counts: dict[str, int], width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {parts}"


def cmd_sweep(args: argparse.Namespace) -> int:
    body: dict[str, Any] = json.loads(Path(args.file).read_text()) if args.file else {}
    if args.spec:
        body["spec"] = json.loads(Path(args.spec).read_text())
    for item in args.grid or []:
        key, _, values = item.partition("=")
        body.setdefault("grid", {})[key] = [_value(v) for v in values.split(";")]
    if "spec" not in body or "grid" not in body:
        raise ClientError("a sweep needs a spec and a grid: --file sweep.json or --spec + --grid")
    if args.isolation:
        body["spec"] = {**body["spec"], "isolation": args.isolation}
    with _client(args) as client:
        sweep = _check(client.post("/v1/sweeps", json=body))
        if args.wait:
            while not sweep["done"]:
                time.sleep(args.poll)
                sweep = _check(client.get(f"/v1/sweeps/{sweep['id']}"))
                counts = sweep["progress"]
                done = sum(counts[k] for k in FINISHED)
                _status_line(_progress_bar(done, sweep["n_points"], counts))
            sys.stderr.write("\n")
        if args.csv:
            text = client.get(f"/v1/sweeps/{sweep['id']}", params={"format": "csv"}).text
            Path(args.csv).write_text(text)
    if args.json:
        _print_json(sweep)
        return 0
    print(f"sweep {sweep['id']}: {sweep['n_points']} points")
    keys = list(sweep["grid"])
    rows = [
        (
            r.index,
            *(_cell(r.values.get(k)) for k in keys),
            r.status if r.error_type is None else f"{r.status}: {r.error_type}",
            _bytes(r.delta_allocated),
            _bytes(r.allocated_peak),
            _bytes(r.predicted_delta),
            _figure("time_s", r.time_s),
        )
        for r in (SweepRow.model_validate(row) for row in sweep["rows"])
    ]
    print(table(["#", *keys, "status", "delta", "peak", "predicted", "time"], rows))
    return 0


def _cell(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, list) else str(value)


def cmd_compare(args: argparse.Namespace) -> int:
    with _client(args) as client:
        ids = [resolve_id(client, i) for i in args.ids]
        out = _check(client.get("/v1/compare", params={"ids": ",".join(ids)}))
    if args.json:
        _print_json(out)
        return 0
    items = out["items"]
    headers = ["figure", *(i["label"] for i in items)]
    rows = []
    for key in items[0]["figures"]:
        row = [key]
        for n, item in enumerate(items):
            value, diff = item["figures"][key], out["differences"][key][n]
            text = _figure(key, value)
            if n and diff:
                text += f" ({'+' if diff > 0 else '-'}{_figure(key, abs(diff))})"
            row.append(text)
        rows.append(row)
    print(table(headers, rows))
    for key, values in out["environment"].items():
        shown = ("not recorded" if v is None else repr(v) if v == "" else str(v) for v in values)
        print(f"environment {key}: {' | '.join(shown)}")
    return 0


def _figure(key: str, value: Any) -> str:
    if key == "time_s":
        return f"{value:.3g} s" if value is not None else ""
    return _bytes(value)


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            code: int = func(args)
            return code
        except ClientError as exc:
            print(f"vramlab: {exc}", file=sys.stderr)
            return 1
        except httpx.TransportError as exc:
            print(f"vramlab: cannot reach {args.api}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            # Ctrl-C: end the line a status line left open and exit as shells expect.
            sys.stderr.write("\n")
            return 130

    return wrapped


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="wait until it has finished")
    p.add_argument(
        "--give-up",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --wait: stop (exit 1, saying why) once no live worker has been able to "
        "run it for this long (default 30)",
    )
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)


def _isolation_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--isolation",
        choices=list(Isolation),
        help="clean (a process of its own, the default) or shared (a worker's long-lived "
        "process: much faster for many small experiments)",
    )


def register(sub: Any) -> None:
    """Add the client commands to ``vramlab``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api",
        default=os.environ.get("VRAMLAB_API_URL", "http://127.0.0.1:8000"),
        help="the API's URL (default: VRAMLAB_API_URL or http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--token", default=os.environ.get("VRAMLAB_TOKEN"), help="API token (VRAMLAB_TOKEN)"
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    p = sub.add_parser("submit", parents=[common], help="submit an experiment")
    p.add_argument("--file", help="a spec as JSON (flags override its fields)")
    p.add_argument("--op")
    p.add_argument("--shape", help="e.g. 1000x1000")
    p.add_argument("--dtype")
    p.add_argument("--device")
    p.add_argument("--trace", choices=["none", "events", "stacks"])
    p.add_argument("--repeat", type=int)
    _isolation_arg(p)
    p.add_argument("--param", action="append", help="KEY=VALUE (VALUE as JSON); repeatable")
    p.add_argument("--tag", action="append")
    _wait_args(p)
    p.set_defaults(func=_run(cmd_submit))

    p = sub.add_parser("presets", parents=[common], help="the named experiments to run")
    p.set_defaults(func=_run(cmd_presets))

    p = sub.add_parser("run", parents=[common], help="run a preset (see `vramlab presets`)")
    p.add_argument("preset")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: what a live worker offers)")
    p.add_argument("--dtype")
    p.add_argument("--size", choices=["small", "medium", "large"], default="medium")
    _isolation_arg(p)
    _wait_args(p)
    p.set_defaults(func=_run(cmd_run))

    p = sub.add_parser("show", parents=[common], help="one experiment (id or unique prefix)")
    p.add_argument("id")
    p.set_defaults(func=_run(cmd_show))

    p = sub.add_parser("cancel", parents=[common], help="cancel a queued or running experiment")
    p.add_argument("id")
    p.set_defaults(func=_run(cmd_cancel))

    p = sub.add_parser("ls", parents=[common], help="list experiments, newest first")
    p.add_argument("--status", choices=list(Status))
    p.add_argument("--op")
    p.add_argument("--device")
    p.add_argument("--tag")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=_run(cmd_ls))

    p = sub.add_parser("trace", parents=[common], help="download an experiment's trace")
    p.add_argument("id")
    p.add_argument("--format", choices=["json", "ndjson", "memory_viz", "chrome"], default="ndjson")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.set_defaults(func=_run(cmd_trace))

    p = sub.add_parser("sweep", parents=[common], help="queue a grid of experiments")
    p.add_argument("--file", help='JSON {"spec": {...}, "grid": {...}}')
    p.add_argument("--spec", help="a spec as a JSON file")
    p.add_argument(
        "--grid",
        action="append",
        help='KEY=V1;V2;... (values as JSON), e.g. \'dtype="float32";"float16"\'',
    )
    _isolation_arg(p)
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    p.add_argument("--csv", help="write the table as CSV to this file")
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    p.set_defaults(func=_run(cmd_sweep))

    p = sub.add_parser("compare", parents=[common], help="experiments side by side")
    p.add_argument("ids", nargs="+")
    p.set_defaults(func=_run(cmd_compare))

    from app import client_fits, recorder  # fit, fits, fit-show; record: modules of their own

    client_fits.register(sub, common)

    recorder.register(sub, common)
