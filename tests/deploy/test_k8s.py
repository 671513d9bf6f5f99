"""The Kubernetes manifests (deploy/k8s, kustomize) rendered by `kubectl kustomize` and
checked for what a fleet needs; the SLURM script run with a stand-in `vramlab` command.

Rendered and checked here, not applied to a cluster: no cluster runs on this machine.
"""

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None and shutil.which("apt-get") is not None:
        subprocess.run(
            "apt-get install -y -qq kubectl || "
            "(apt-get update -qq && apt-get install -y -qq kubectl)",
            shell=True, capture_output=True, timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
        found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed and could not be installed: nothing renders")
    return found


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    done = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / "example")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in of(docs, kind) if d["metadata"]["name"] == name)


def secret_ref(container: dict[str, Any], var: str) -> tuple[str, str]:
    env = {e["name"]: e for e in container.get("env", [])}
    ref = env[var]["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]


def test_every_pod_is_non_root_read_only_and_runs_a_real_command(rendered: list) -> None:
    parser = build_parser()
    for name, spec in pod_specs(rendered):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert c["image"].startswith("registry.example.org/vramlab/"), name
            assert c["args"][0] == "vramlab"
            parser.parse_args(c["args"][1:])  # the CLI's own parser takes these flags
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts, name
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {
        "vramlab"
    }


def test_the_api_runs_several_replicas_behind_one_service_with_probes(rendered: list) -> None:
    api = named(rendered, "Deployment", "vramlab-api")
    assert api["spec"]["replicas"] >= 2
    pod = api["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = int(c["args"][c["args"].index("--port") + 1])
    assert {p["containerPort"] for p in c["ports"]} == {port}
    # One shared session key and one database, from the Secret, for every replica.
    assert secret_ref(c, "VRAMLAB_SESSION_SECRET") == ("vramlab", "session-secret")
    assert secret_ref(c, "VRAMLAB_DATABASE_URL") == ("vramlab", "database-url")
    assert secret_ref(c, "VRAMLAB_WORKER_TOKEN") == ("vramlab", "worker-token")
    services = [
        s
        for s in of(rendered, "Service")
        if s["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ]
    assert len(services) == 1
    assert services[0]["spec"]["ports"][0]["targetPort"] in ("http", port)
    pdb = named(rendered, "PodDisruptionBudget", "vramlab-api")
    assert pdb["spec"]["minAvailable"] >= 1


def test_the_migration_is_a_job_on_the_same_database(rendered: list) -> None:
    job = named(rendered, "Job", "vramlab-migrate")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["vramlab", "migrate"]
    assert secret_ref(c, "VRAMLAB_DATABASE_URL") == ("vramlab", "database-url")
    api = named(rendered, "Deployment", "vramlab-api")
    assert c["image"] == api["spec"]["template"]["spec"]["containers"][0]["image"]


def test_gpu_workers_one_per_gpu_per_type_with_the_drain_as_grace(rendered: list) -> None:
    settings = named(rendered, "ConfigMap", "vramlab-settings")["data"]
    max_timeout = float(settings["VRAMLAB_MAX_TIMEOUT_S"])
    workers = [d for d in of(rendered, "Deployment") if "worker" in d["metadata"]["name"]]
    assert len(workers) == 2
    products, selectors = set(), []
    for w in workers:
        spec = w["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert c["args"][-2:] == ["--device", "cuda"]
        products.add(spec["nodeSelector"]["nvidia.com/gpu.product"])
        selectors.append(w["spec"]["selector"]["matchLabels"])
        assert w["spec"]["selector"]["matchLabels"].items() <= (
            w["spec"]["template"]["metadata"]["labels"].items()
        )
        # SIGTERM lets the running experiment (at most max_timeout) finish and report.
        assert spec["terminationGracePeriodSeconds"] >= max_timeout + 30
        assert secret_ref(c, "VRAMLAB_WORKER_TOKEN") == ("vramlab", "worker-token")
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["VRAMLAB_API_URL"] == "http://vramlab-api:8000"
    assert len(products) == 2  # each GPU type on its own nodes
    assert selectors[0] != selectors[1]  # no Deployment adopts the other's pods


SLURM = ROOT / "deploy" / "slurm" / "vramlab-workers.sbatch"
FAKE_WORKER = """#!/usr/bin/env bash
echo "$CUDA_VISIBLE_DEVICES $*" > "$OUT/started.$CUDA_VISIBLE_DEVICES"
trap 'echo drained > "$OUT/drained.$CUDA_VISIBLE_DEVICES"; exit 0' TERM
while :; do sleep 0.1; done
"""


def test_the_slurm_script_runs_one_worker_per_gpu_and_drains_them(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vramlab"
    fake.write_text(FAKE_WORKER)
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(tmp_path),
        "CUDA_VISIBLE_DEVICES": "0,1,3",
        "SLURM_JOB_ID": "42",
        "VRAMLAB_API_URL": "http://api.example:8000",
        "VRAMLAB_WORKER_TOKEN": "t",
        "VRAMLAB_VENV": str(tmp_path / "none"),
    }
    job = subprocess.Popen(["bash", str(SLURM)], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("started.*"))) < 3:
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)  # what --signal=B:TERM@660 sends before the time limit
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 0, out
    for dev in ("0", "1", "3"):
        args = shlex.split((tmp_path / f"started.{dev}").read_text())
        assert args[0] == dev  # each worker sees only its own GPU
        parsed = build_parser().parse_args(args[1:])
        assert parsed.device == "cuda" and parsed.api == "http://api.example:8000"
        assert parsed.name.endswith(f"-42-gpu{dev}")
        assert (tmp_path / f"drained.{dev}").read_text().strip() == "drained"
