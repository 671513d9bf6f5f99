"""Prometheus metrics, read from the database at scrape time.

The queue lives in the database, so its gauges are counted there on each scrape: every
API replica reports the same figures. The counters are this process's own: the claims'
looks for work, by whether they found any (a look that finds nothing is a transaction
that took the database, and SQLite's write slot, for nothing), and the claims and batch
reports with the experiments each carried.
"""

from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select

from app.core.config import Settings
from app.core.db import Database
from app.experiments import predictor
from app.queue import workers
from app.tables import Experiment
from vramlab.contract import Status


class QueueCollector(Collector):
    def __init__(self, db: Database, settings: Settings, clock: Callable[[], datetime]) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        experiments = GaugeMetricFamily(
            "vramlab_experiments", "Experiments by status", labels=["status"]
        )
        failures = GaugeMetricFamily(
            "vramlab_experiments_failed", "Failed experiments by error type", labels=["type"]
        )
        live_workers = GaugeMetricFamily(
            "vramlab_workers_live", "Workers that sent a heartbeat lately"
        )
        imported = GaugeMetricFamily("vramlab_snapshots", "Imported memory snapshots")
        predictor_ready = GaugeMetricFamily(
            "vramlab_predictor_lanes_ready",
            "The model predictor's lanes (children) in this API process that have started",
        )
        predictor_ready.add_metric([], predictor.ready_lanes())
        with self.db.session(write=False) as s:
            by_status = dict(
                s.execute(
                    select(Experiment.status, func.count())
                    .where(Experiment.kind == "experiment")
                    .group_by(Experiment.status)
                ).all()
            )
            snapshots = s.scalar(select(func.count()).where(Experiment.kind == "snapshot"))
            by_error = s.execute(
                select(Experiment.error_type, func.count())
                .where(Experiment.status == Status.FAILED)
                .group_by(Experiment.error_type)
            ).all()
            live = workers.count_live(s, self.clock(), self.settings.worker_live_seconds)
        for status in Status:
            experiments.add_metric([status], by_status.get(status, 0))
        for error_type, n in by_error:
            failures.add_metric([error_type or "unknown"], n)
        live_workers.add_metric([], live)
        imported.add_metric([], snapshots or 0)
        yield experiments
        yield imported
        yield failures
        yield live_workers
        yield predictor_ready


def claim_looks(registry: CollectorRegistry) -> Counter:
    return Counter(
        "vramlab_claim_looks",
        "Looks for work by this process's waiting claims, by whether they found any",
        labelnames=["found"],
        registry=registry,
    )


class BatchCalls:
    """This process's claims that took work and its batch reports: requests, and the
    experiments they carried (their ratio is how many a call carried: what a worker's
    pacing is for)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "vramlab_batch_calls",
            "Claims that took work and batch reports, by call",
            labelnames=["call"],
            registry=registry,
        )
        self.experiments = Counter(
            "vramlab_batch_experiments",
            "Experiments carried by claims and batch reports, by call",
            labelnames=["call"],
            registry=registry,
        )

    def count(self, call: str, experiments: int) -> None:
        self.calls.labels(call=call).inc()
        self.experiments.labels(call=call).inc(experiments)
