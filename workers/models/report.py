"""A model experiment's result: its steps and phases, the reported step's peaks, what held
memory at the peak by category, speed, and notes in plain words.

The op (workers/ops/model.py) leaves its raw record in the details (``model_run``); the
sections' figures are known only after the run (on the CPU they come from the profiler's
events), so the child calls ``finish`` once the trace has stopped.
"""

from __future__ import annotations

from typing import Any

from vramlab import wire
from vramlab.contract import (
    Categories,
    Category,
    ModelFigures,
    ModelStep,
    PhasePeak,
    RankFigures,
)
from vramlab.runspec import RunSpec
from vramlab.units import human_bytes

RAW = "model_run"
MiB = 2**20


def finish(result: dict[str, Any], details: dict[str, Any], records: dict[str, Any]) -> None:
    """Move the op's raw record into ``result['model']`` and ``result['categories']``."""
    raw = details.pop(RAW, None)
    if raw is None:
        return
    if "ranks" in raw:
        _merge_ranks(result, raw)
        return
    steps: list[ModelStep] = []
    for step in raw["steps"]:
        number = step["step"]
        by_name: dict[str, PhasePeak] = {}
        for ph in raw["phases"]:
            figures = records.get(ph["section"])
            if ph["step"] != number or figures is None:
                continue
            allocated = int(figures["allocated_peak"])
            reserved = int(ph["peak_reserved"] if ph["peak_reserved"] is not None else allocated)
            seen = by_name.get(ph["name"])
            if seen is None:
                by_name[ph["name"]] = PhasePeak(
                    name=ph["name"],
                    peak_allocated=allocated,
                    peak_reserved=reserved,
                    allocated_end=int(figures["allocated_end"]),
                    wall_s=ph["wall_s"],
                )
            else:  # another micro-batch of the same phase
                seen.peak_allocated = max(seen.peak_allocated, allocated)
                seen.peak_reserved = max(seen.peak_reserved, reserved)
                seen.allocated_end = int(figures["allocated_end"])
                seen.wall_s = (seen.wall_s or 0.0) + ph["wall_s"]
        phases = list(by_name.values())
        steps.append(
            ModelStep(
                step=number,
                peak_allocated=max((p.peak_allocated for p in phases), default=0),
                peak_reserved=max((p.peak_reserved for p in phases), default=0),
                phases=phases,
                wall_s=step["wall_s"],
            )
        )
    if not steps:
        return
    reported = steps[-1]
    wall = reported.wall_s or 0.0
    figures = ModelFigures(
        model=raw["model"],
        model_type=raw["model_type"],
        task=raw["task"],
        parameter_count=raw["parameter_count"],
        parameter_bytes=raw["parameter_bytes"],
        gradient_bytes=raw["gradient_bytes"],
        optimizer_state_bytes=raw["optimizer_state_bytes"],
        trainable_parameter_count=raw.get("trainable_parameter_count"),
        trainable_parameters=raw.get("trainable_parameters"),
        paged_optimizer_state_bytes=raw.get("paged_optimizer_state_bytes"),
        reported_step=reported.step,
        peak_allocated=reported.peak_allocated,
        peak_reserved=reported.peak_reserved,
        steps=steps,
        time_per_step_s=wall or None,
        samples_per_s=raw["batch_size"] / wall if wall else None,
        tokens_per_s=raw["tokens_per_step"] / wall if wall and raw["tokens_per_step"] else None,
    )
    result["model"] = wire.dump(figures)
    tally = raw["tally"]
    result["categories"] = at_measured_peak(tally["categories"], reported.peak_allocated)
    details["model_tally"] = {
        "peak": tally["peak"],
        "phase": tally["phase"],
        "how": "a copy of the reported step run under the category tally (tensor storages "
        "by identity and by the phase that made them); what it does not see (library "
        "workspaces, kernels' own buffers) is counted as temporaries",
    }


def _merge_ranks(result: dict[str, Any], raw: dict[str, Any]) -> None:
    """A distributed run's figures: each rank's, and the highest rank's as the run's (its
    peaks, what held them); DDP's buckets counted as gradients in each rank's categories."""
    ranks: list[RankFigures] = []
    for one in raw["ranks"]:
        model, categories = one["model"], dict(one["categories"])
        buckets = one.get("bucket_bytes") or 0
        if buckets:  # no tensor the tally sees holds them: they were in temporaries
            moved = min(buckets, categories.get(str(Category.TEMPORARIES), 0))
            categories[str(Category.TEMPORARIES)] -= moved
            categories[str(Category.GRADIENTS)] = categories.get(str(Category.GRADIENTS), 0) + moved
        ranks.append(
            RankFigures(
                rank=one["rank"],
                device=one["device"],
                peak_allocated=model["peak_allocated"],
                peak_reserved=model["peak_reserved"],
                parameter_bytes=model["parameter_bytes"],
                gradient_bytes=model["gradient_bytes"],
                optimizer_state_bytes=model["optimizer_state_bytes"],
                bucket_bytes=buckets or None,
                categories=wire.load(Categories, categories),
                steps=[wire.load(ModelStep, s) for s in model["steps"]],
            )
        )
    top = max(ranks, key=lambda r: (r.peak_allocated, -r.rank))
    model = dict(next(one["model"] for one in raw["ranks"] if one["rank"] == top.rank))
    model.update(distributed=raw["distributed"], ranks=[wire.dump(r) for r in ranks])
    result["model"] = model
    result["categories"] = wire.dump(top.categories)


def at_measured_peak(tallied: dict[str, int], measured: int) -> dict[str, int]:
    """The tally's categories, made to add up to the measured peak: memory the tally does
    not see (workspaces) is temporaries; where the tally saw more, temporaries and then
    activations give it back."""
    out = {k: int(v) for k, v in tallied.items()}
    diff = measured - sum(out.values())
    for key in (Category.TEMPORARIES, Category.ACTIVATIONS, Category.OTHER):
        if diff >= 0:
            break
        take = min(out.get(key, 0), -diff)
        out[key] = out.get(key, 0) - take
        diff += take
    if diff > 0:
        out[Category.TEMPORARIES] = out.get(Category.TEMPORARIES, 0) + diff
    return {str(k): v for k, v in out.items()}


def notes(result: dict[str, Any], spec: RunSpec) -> list[str]:
    """Plain words on a model experiment's figures."""
    model = result.get("model")
    if not model:
        return []
    said: list[str] = []
    prediction = spec.prediction
    predicted = prediction.peak_allocated if prediction is not None else None
    ran_on = "cpu" if str(spec.device) == "cpu" else "cuda"
    predicted_for = str((prediction.predicted_for if prediction else None) or ran_on)
    if predicted and not predicted_for.startswith(ran_on):
        said.append(
            f"Predicted before it ran, for {predicted_for}: step {model['reported_step']} "
            f"peaks at {human_bytes(predicted)}; it ran on the {ran_on}, where it measured "
            f"{human_bytes(model['peak_allocated'])} (not comparable: no device was named)."
        )
    elif predicted:
        error = 100 * (predicted - model["peak_allocated"]) / max(1, model["peak_allocated"])
        said.append(
            f"Predicted before it ran: step {model['reported_step']} peaks at "
            f"{human_bytes(predicted)}; measured {human_bytes(model['peak_allocated'])} "
            f"({error:+.1f}%)."
        )
    steps = model["steps"]
    peak, reserved = model["peak_allocated"], model["peak_reserved"]
    if model["task"] == "train" and len(steps) >= 2:
        first = steps[0]["peak_allocated"]
        said.append(
            f"Step 1 peaked at {human_bytes(first)}, step {model['reported_step']} at "
            f"{human_bytes(peak)}: step {model['reported_step']} is reported because the "
            f"optimizer's state exists from step 1's end on"
            + (
                f" ({human_bytes(peak - first)} more)."
                if peak > first
                else " (step 1 peaked as high: its activations outweighed the state)."
            )
        )
    cats = result.get("categories") or {}
    if cats and peak:
        top = max(cats, key=lambda k: cats[k])
        said.append(
            f"At the peak, {top.replace('_', ' ')} held the most: {human_bytes(cats[top])} "
            f"of {human_bytes(peak)} ({100 * cats[top] / peak:.0f}%)."
        )
    if reserved > peak * 1.2 and reserved - peak > 64 * MiB:
        said.append(
            f"Reserved ({human_bytes(reserved)}) is far above allocated ({human_bytes(peak)}) "
            f"at the peak: the caching allocator's segments are fragmented"
            + (
                "."
                if spec.allocator.expandable_segments
                else "; allocator settings `expandable_segments: true` usually closes "
                "most of that gap."
            )
        )
    if spec.model is not None and spec.model.checkpointing:
        said.append(
            "Activation checkpointing is on: the forward keeps only each layer's input and "
            "recomputes the rest during the backward, so activations are small and the "
            "backward does more work."
        )
    return said
