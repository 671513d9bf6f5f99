"""How the OpenAPI document names things: operation ids a generated client can use,
and tags that keep the worker protocol apart from the public API."""

from typing import Any

from fastapi.routing import APIRoute

WORKER_TAG = "worker protocol (internal)"
TAGS: list[dict[str, Any]] = [
    {"name": "experiments", "description": "Queue experiments, read and cancel them."},
    {"name": "traces", "description": "An experiment's allocator trace, in several formats."},
    {"name": "results", "description": "Views of results: the peak, timelines."},
    {"name": "sweeps", "description": "A grid of specs queued at once, and its table."},
    {
        "name": "fits",
        "description": "The largest batch size or sequence length that fits a capacity: "
        "predicted, then measured by trials.",
    },
    {
        "name": "plans",
        "description": "Will it fit: a model's step predicted for GPUs, nothing run.",
    },
    {"name": "gpus", "description": "The GPU catalog: usable memory and what changes bytes."},
    {"name": "compare", "description": "Experiments side by side."},
    {"name": "presets", "description": "Ready-made experiments from the articles."},
    {"name": "catalog", "description": "Ops, their parameters, dtypes and devices."},
    {"name": "workers", "description": "Workers as operators see them."},
    {"name": "health", "description": "Liveness, readiness, metrics."},
    {
        "name": WORKER_TAG,
        "description": "INTERNAL: the protocol between the API and `vramlab worker` (needs the "
        "`worker` scope). Not for clients: leave it out of generated clients.",
        "x-internal": True,
    },
]


# Readable ids for a generated client (FastAPI's own would be `submit_v1_experiments_post`),
# named here rather than by the route functions so each reads as verb and noun.
OPERATION_IDS = {
    ("POST", "/v1/experiments"): "submit_experiment",
    ("GET", "/v1/experiments"): "list_experiments",
    ("GET", "/v1/experiments/{experiment_id}"): "get_experiment",
    ("POST", "/v1/experiments/{experiment_id}/cancel"): "cancel_experiment",
    ("GET", "/v1/experiments/{experiment_id}/trace"): "get_trace",
    ("GET", "/v1/experiments/{experiment_id}/peak"): "get_peak",
    ("GET", "/v1/experiments/{experiment_id}/timeline"): "get_timeline",
    ("GET", "/v1/catalog"): "get_catalog",
    ("GET", "/v1/workers"): "list_workers",
    ("POST", "/v1/sweeps"): "create_sweep",
    ("GET", "/v1/sweeps/{sweep_id}"): "get_sweep",
    ("GET", "/v1/sweeps/{sweep_id}/plot"): "get_sweep_plot",
    ("POST", "/v1/fits"): "create_fit",
    ("GET", "/v1/fits"): "list_fits",
    ("GET", "/v1/fits/{fit_id}"): "get_fit",
    ("POST", "/v1/fits/{fit_id}/cancel"): "cancel_fit",
    ("GET", "/v1/fits/{fit_id}/plot"): "get_fit_plot",
    ("POST", "/v1/plans"): "create_plan",
    ("GET", "/v1/gpus"): "list_gpus",
    ("GET", "/v1/compare"): "compare_experiments",
    ("GET", "/v1/compare/timeline"): "get_compare_timeline",
    ("GET", "/v1/presets"): "list_presets",
    ("POST", "/v1/presets/{name}/runs"): "run_preset",
    ("GET", "/healthz"): "get_health",
    ("GET", "/readyz"): "get_readiness",
    ("GET", "/metrics"): "get_metrics",
    ("POST", "/v1/worker/register"): "worker_register",
    ("POST", "/v1/worker/claim"): "worker_claim",
    ("POST", "/v1/worker/experiments/{experiment_id}/heartbeat"): "worker_heartbeat",
    ("PUT", "/v1/worker/experiments/{experiment_id}/trace/{seq}"): "worker_upload_trace_chunk",
    ("POST", "/v1/worker/experiments/{experiment_id}/result"): "worker_report_outcome",
    ("POST", "/v1/worker/experiments/{experiment_id}/release"): "worker_release",
    ("POST", "/v1/worker/stop"): "worker_stop",
}


def operation_id(route: APIRoute) -> str:
    """The id named above; else the route function's name (``worker_``-prefixed in the
    worker protocol). Ids are unique across the app: a test checks."""
    for method in sorted(route.methods or ()):
        if (method, route.path) in OPERATION_IDS:
            return OPERATION_IDS[(method, route.path)]
    if WORKER_TAG in route.tags and not route.name.startswith("worker_"):
        return f"worker_{route.name}"
    return route.name
