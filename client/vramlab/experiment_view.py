"""One experiment for people (``vramlab show`` and ``submit --wait``): its status, its
figures beside the prediction, and a model experiment's steps and categories. Reads the
API's JSON as plain data (no schema library), in the order the contract defines."""

from typing import Any

from vramlab.names import CATEGORY_KEYS, MEMORY_KEYS, SHARED_PROCESS_FIGURES, Isolation
from vramlab.render import size, table

# A result's memory figures past the v1 keys, in the contract's order (MemoryFigures).
EXTRA_MEMORY_KEYS = (
    "device_used_before",
    "device_used_after",
    "pinned_host_before",
    "pinned_host_after",
)


def said(exp: dict[str, Any]) -> str:
    """The status as the API words it for people (an expected refusal as the answer)."""
    return str(exp.get("status_line") or exp["status"])


def describe(spec: dict[str, Any]) -> str:
    """A spec in a few words: a model experiment by its model and knobs."""
    if spec["op"] == "model":
        p = spec.get("params") or {}
        return (
            f"{p.get('model')} {p.get('task')} batch {model_size(spec)} "
            f"{p.get('precision')} {spec['device']}"
        )
    return f"{spec['op']} {'x'.join(map(str, spec['shape']))} {spec['dtype']} {spec['device']}"


def model_size(spec: dict[str, Any]) -> str:
    """A model experiment's batch and length (``16 x 1024``, ``32 x 224px``)."""
    p = spec.get("params") or {}
    length = p.get("seq_len") or (f"{p['image_size']}px" if p.get("image_size") else None)
    return f"{p.get('batch_size')}" + (f" x {length}" if length else "")


def predicted_peak(exp: dict[str, Any]) -> int | None:
    """What the list shows as predicted: a model's peak, an op's delta."""
    prediction = exp.get("prediction") or {}
    key = "peak_allocated" if exp.get("spec", {}).get("op") == "model" else "delta_allocated"
    value = prediction.get(key)
    return value if isinstance(value, int) else None


def prediction_lines(prediction: dict[str, Any]) -> list[str]:
    """A model's prediction for people: its peak, the device it is for, what holds it."""
    peak = prediction.get("peak_allocated")
    if not isinstance(peak, int):
        said = "; ".join(prediction.get("caveats") or []) or "no prediction"
        return [f"not predicted: {said}"]
    lines = [
        f"predicted for {prediction.get('predicted_for') or 'its device'}: the step peaks at "
        f"{size(peak)} allocated"
        + (
            f", {size(prediction['peak_reserved'])} reserved"
            if prediction.get("peak_reserved")
            else ""
        )
    ]
    categories = prediction.get("categories") or {}
    rows = [
        (k.replace("_", " "), size(v), f"{100 * v / peak:.0f}%" if peak else "")
        for k, v in sorted(categories.items(), key=lambda kv: -(kv[1] or 0))
        if v
    ]
    if rows:
        lines.append(table(["category", "predicted", "share"], rows))
    lines += [
        f"note: {c}" for c in prediction.get("caveats") or [] if c.startswith("predicted for")
    ]
    return lines


def result_of(exp: dict[str, Any]) -> dict[str, Any] | None:
    """The experiment's result (an imported snapshot's too), or None."""
    return exp.get("result") or None


def is_snapshot(exp: dict[str, Any]) -> bool:
    return exp.get("kind") == "snapshot"


def memory_rows(exp: dict[str, Any], result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The memory figures in the contract's order (a snapshot has no device extras)."""
    memory = result.get("memory") or {}
    keys = MEMORY_KEYS if is_snapshot(exp) else (*MEMORY_KEYS, *EXTRA_MEMORY_KEYS)
    return [(k, memory.get(k)) for k in keys]


def shared_process_figures(exp: dict[str, Any], result: dict[str, Any]) -> tuple[str, ...]:
    """The figures that depend on what ran earlier in a shared process (none for a clean
    process, a shared process's first experiment, or a snapshot)."""
    env = result.get("environment") or {}
    if is_snapshot(exp) or env.get("isolation") != Isolation.SHARED:
        return ()
    return tuple(str(f) for f in SHARED_PROCESS_FIGURES) if env.get("experiments_before") else ()


def show_experiment(exp: dict[str, Any]) -> None:
    spec = exp["spec"]
    print(f"{exp['id']}  {said(exp)}  {describe(spec)}")
    for note in exp.get("preset_notes") or []:
        print(f"note: {note}")
    if exp.get("error"):
        what = "PyTorch's refusal" if exp.get("expected_refusal") else "error"
        print(f"{what}: {exp['error']['type']}: {exp['error']['message']}")
        over = ranks_over_words(exp["error"])
        if over:
            print(over)
    result = result_of(exp)
    if result is None:
        if spec["op"] == "model" and exp.get("prediction"):
            for line in prediction_lines(exp["prediction"]):
                print(line)
        return
    prediction = exp.get("prediction") or {}
    if spec["op"] == "model":  # a model's prediction is its step's peak, not an op's figures
        figures = {"allocated_peak": "peak_allocated", "reserved_peak": "peak_reserved"}
        prediction = {
            **{k: prediction.get(v) for k, v in figures.items()},
            "peak_allocated": prediction.get("peak_allocated"),
            "categories": prediction.get("categories"),
        }
    shared = shared_process_figures(exp, result)
    rows = [
        (f"{k} †" if k in shared else k, size(v), v, size(prediction.get(k)))
        for k, v in memory_rows(exp, result)
    ]
    print(table(["figure", "measured", "bytes", "predicted"], rows))
    if shared:
        print(
            "† a shared-process figure: it starts from what earlier experiments left in the "
            "shared process, so it depends on that history (--isolation clean: this alone)"
        )
    if is_snapshot(exp):
        code = (result.get("snapshot") or {}).get("program_exit")
        if code not in (None, 0):
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            print(f"partial: the recorded program {how}; this snapshot holds the run until then")
        return
    if result.get("model") is not None:
        predicted_for = (exp.get("prediction") or {}).get("predicted_for")
        if predicted_for:
            print(f"predicted for {predicted_for}")
        show_model(result, prediction)
    for note in result.get("notes") or []:
        print(f"- {note}")


def show_model(result: dict[str, Any], prediction: dict[str, Any]) -> None:
    """A model experiment: its steps' phases, and what held memory at the reported peak."""
    figures = result["model"]
    print(
        f"\n{figures['model']} ({figures['model_type']}, {figures['parameter_count']:,} "
        f"parameters): {figures['task']}, step {figures['reported_step']} peaked at "
        f"{size(figures['peak_allocated'])} allocated, "
        f"{size(figures['peak_reserved'])} reserved"
    )
    phases = [
        (
            s["step"],
            ph["name"],
            size(ph["peak_allocated"]),
            size(ph["peak_reserved"]),
            f"{ph['wall_s']:.3g}" if ph.get("wall_s") is not None else "",
        )
        for s in figures.get("steps") or []
        for ph in s.get("phases") or []
    ]
    print(table(["step", "phase", "peak allocated", "peak reserved", "seconds"], phases))
    predicted = prediction.get("categories") or {}
    categories = result.get("categories")
    if categories is not None:
        peak = figures["peak_allocated"] or 1
        measured = {k: categories.get(k, 0) for k in CATEGORY_KEYS}
        rows = [
            (k.replace("_", " "), size(v), f"{100 * v / peak:.0f}%", size(predicted.get(k)))
            for k, v in measured.items()
            if v or predicted.get(k)
        ]
        rows.append(
            ("total", size(figures["peak_allocated"]), "", size(prediction.get("peak_allocated")))
        )
        print(f"\nat step {figures['reported_step']}'s peak, by category:")
        print(table(["category", "measured", "share", "predicted"], rows))
    if figures.get("ranks"):
        show_ranks(figures, prediction)
    if figures.get("time_per_step_s"):
        speed = f"{figures['time_per_step_s']:.3g} s a step"
        if figures.get("tokens_per_s"):
            speed += f", {figures['tokens_per_s']:,.0f} tokens/s"
        elif figures.get("samples_per_s"):
            speed += f", {figures['samples_per_s']:,.1f} samples/s"
        print(speed)


def strategy_words(plan: dict[str, Any] | None, ranks: list[dict[str, Any]]) -> str:
    """A distributed run's plan in words: "FSDP2 full sharding on 2 GPUs, bf16 mixed
    precision" (CPU ranks under gloo are named as such)."""
    plan = plan or {}
    n = plan.get("gpus") or len(ranks)
    on_gpus = any(str(r.get("device", "")).startswith("cuda") for r in ranks)
    where = f"on {n} GPUs" if on_gpus or not ranks else f"on {n} CPU ranks (gloo)"
    if plan.get("strategy") == "fsdp":
        words = [f"FSDP2 {plan.get('sharding') or 'full'} sharding {where}"]
        if plan.get("mixed_precision"):
            words.append(f"{plan['mixed_precision']} mixed precision")
        if plan.get("offload_optimizer"):
            words.append("optimizer offloaded to the host")
        return ", ".join(words)
    return f"{str(plan.get('strategy') or '?').upper()} {where}"


def rank_rows(figures: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each rank's figures for people: rank, device, peaks, its shards and DDP's buckets."""
    return [
        (
            r["rank"],
            r["device"],
            size(r["peak_allocated"]),
            size(r["peak_reserved"]),
            size(r.get("parameter_bytes")),
            size(r.get("gradient_bytes")),
            size(r.get("optimizer_state_bytes")),
            size(r.get("bucket_bytes")) if r.get("bucket_bytes") else "",
        )
        for r in figures.get("ranks") or []
    ]


RANK_HEADERS = (
    "rank",
    "device",
    "peak allocated",
    "peak reserved",
    "parameters",
    "gradients",
    "optimizer state",
    "buckets",
)


def ranks_over_words(error: dict[str, Any] | None) -> str | None:
    """A failed distributed run's ranks past the emulated card, or None."""
    details = (error or {}).get("details")
    if not isinstance(details, dict) or not details.get("ranks_over"):
        return None
    over = ", ".join(str(r) for r in details["ranks_over"])
    peaks = details.get("rank_peaks") or []
    card = details.get("capacity_bytes")
    return (
        f"over the emulated card{f' ({size(card)})' if isinstance(card, int) else ''}: "
        f"rank{'s' if len(details['ranks_over']) > 1 else ''} {over}"
        + (f" (peaks by rank: {', '.join(size(p) for p in peaks)})" if peaks else "")
    )


def show_ranks(figures: dict[str, Any], prediction: dict[str, Any]) -> None:
    """A distributed run's ranks: each one's peaks and shards (the run's peak is the
    highest rank's), and the predicted peak of a rank (ranks on equal batches are alike)."""
    print(f"\n{strategy_words(figures.get('distributed'), figures['ranks'])}, batch_size per rank:")
    print(table(list(RANK_HEADERS), rank_rows(figures)))
    if prediction.get("peak_allocated"):
        print(f"predicted peak of a rank: {size(prediction['peak_allocated'])} allocated")
