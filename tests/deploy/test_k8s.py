"""The Kubernetes manifests (deploy/k8s, kustomize) rendered by `kubectl kustomize` and
checked for what a fleet needs; the SLURM script run with a stand-in `vramlab` command.

Rendered and checked here, not applied to a cluster: no cluster runs on this machine.
"""

import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
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


# The Kubernetes versions whose schemas the manifests must pass: the oldest still in use
# (1.29, whose extended support ends in 2026) up to the newest kubernetes-validate knows.
K8S_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_passes_the_kubernetes_schema(rendered: list, version: str) -> None:
    # Strict: a field the API server does not know (a typo, one of a later version) fails.
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)


def test_no_pod_mounts_a_service_account_token(rendered: list) -> None:
    # None of vramlab's processes calls the Kubernetes API.
    for name, spec in pod_specs(rendered):
        assert spec["automountServiceAccountToken"] is False, name


def test_the_migration_job_has_resource_requests_and_limits(rendered: list) -> None:
    job = named(rendered, "Job", "vramlab-migrate")
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


def test_api_replicas_are_spread_over_nodes(rendered: list) -> None:
    pod = named(rendered, "Deployment", "vramlab-api")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    hard = [
        c
        for c in pod["spec"]["topologySpreadConstraints"]
        if c["topologyKey"] == "kubernetes.io/hostname"
        and c["whenUnsatisfiable"] == "DoNotSchedule"
        and c["maxSkew"] == 1
        and c["labelSelector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(hard) == 1


def test_the_worker_liveness_probe_reads_the_file_the_worker_keeps(rendered: list) -> None:
    for d in of(rendered, "Deployment"):
        if "worker" not in d["metadata"]["name"]:
            continue
        c = d["spec"]["template"]["spec"]["containers"][0]
        alive = build_parser().parse_args(c["args"][1:]).alive_file
        assert alive is not None and str(alive).startswith("/tmp/")  # a writable mount
        command = c["livenessProbe"]["exec"]["command"]
        assert command[:2] == ["sh", "-c"] and str(alive) in command[2]
        # tests/workers/test_alive.py runs this command against a working worker loop.


@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (its namespace and labels, the ports it serves) or
    an address outside the cluster's pods."""

    name: str
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    ports: tuple[tuple[str, int], ...] = field(default=())
    ip: str | None = None


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        has, value = expr["key"] in labels, labels.get(expr["key"])
        ok = {
            "In": has and value in expr.get("values", []),
            "NotIn": not has or value not in expr.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[expr["operator"]]
        if not ok:
            return False
    return True


def _peer_matches(rule_peer: dict[str, Any], peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in rule_peer:
        if peer.ip is None:
            return False
        block = rule_peer["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if peer.namespace is None:
        return False
    if "namespaceSelector" in rule_peer:
        namespace_labels = {"kubernetes.io/metadata.name": peer.namespace}
        if not _selects(rule_peer["namespaceSelector"], namespace_labels):
            return False
    elif peer.namespace != policy_namespace:
        return False
    return "podSelector" not in rule_peer or _selects(rule_peer["podSelector"], dict(peer.labels))


def _port_matches(rule_ports: list[dict[str, Any]] | None, to: Peer, port: int, proto: str) -> bool:
    if not rule_ports:
        return True
    named = dict(to.ports)
    for p in rule_ports:
        wanted = p.get("port")
        if isinstance(wanted, str):
            wanted = named.get(wanted)
        if p.get("protocol", "TCP") == proto and (p.get("port") is None or wanted == port):
            return True
    return False


def _side_allows(
    policies: list[dict[str, Any]], pod: Peer, other: Peer, port: int, proto: str, egress: bool
) -> bool:
    """Whether the policies selecting ``pod`` let it reach (egress) or be reached by
    (ingress) ``other``; a pod that no policy of this direction selects is not isolated."""
    kind, rules_key, peers_key = (
        ("Egress", "egress", "to") if egress else ("Ingress", "ingress", "from")
    )
    to = other if egress else pod
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and kind in p["spec"]["policyTypes"]
        and _selects(p["spec"]["podSelector"], dict(pod.labels))
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            namespace = policy["metadata"]["namespace"]
            if (not peers or any(_peer_matches(x, other, namespace) for x in peers)) and (
                _port_matches(rule.get("ports"), to, port, proto)
            ):
                return True
    return False


def test_network_policies_allow_exactly_the_pairs_vramlab_needs(rendered: list) -> None:
    policies = of(rendered, "NetworkPolicy")
    ours: dict[str, Peer] = {}
    for d in rendered:
        if d["kind"] not in ("Deployment", "Job"):
            continue
        template = d["spec"]["template"]
        ports = tuple(
            (p["name"], p["containerPort"])
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
            if "name" in p
        )
        labels = tuple(sorted(template["metadata"]["labels"].items()))
        name = d["metadata"]["name"].removeprefix("vramlab-")
        ours[name] = Peer(name, d["metadata"]["namespace"], labels, ports)
    assert set(ours) == {"api", "migrate", "predictor", "worker-h100", "worker-a100"}
    others = [
        Peer("dns", "kube-system", (("k8s-app", "kube-dns"),)),
        Peer("ingress-controller", "ingress-nginx", (("app", "ingress-nginx"),)),
        Peer("database", ip="10.20.30.40"),  # the overlay's PostgreSQL
        Peer("internet", ip="203.0.113.7"),
    ]
    tries = [
        (8000, "TCP"),
        (8100, "TCP"),
        (5432, "TCP"),
        (53, "UDP"),
        (53, "TCP"),
        (443, "TCP"),
        (22, "TCP"),
    ]
    allowed = set()
    for src in [*ours.values(), *others]:
        for dst in [*ours.values(), *others]:
            if src == dst or (src.name not in ours and dst.name not in ours):
                continue  # not vramlab's traffic: the policies here do not speak of it
            for port, proto in tries:
                out = src.name not in ours or _side_allows(policies, src, dst, port, proto, True)
                into = dst.name not in ours or _side_allows(policies, dst, src, port, proto, False)
                if out and into:
                    allowed.add((src.name, dst.name, port, proto))
    workers = ["worker-h100", "worker-a100"]
    expected = {
        # Only the API (and its migration) reach PostgreSQL.
        ("api", "database", 5432, "TCP"),
        # Only the API asks the model predictor, which reaches nothing.
        ("api", "predictor", 8100, "TCP"),
        ("migrate", "database", 5432, "TCP"),
        # Workers reach only the API; it is the service's front door for everyone else
        # (people, through an ingress controller or not), on its port alone.
        *((w, "api", 8000, "TCP") for w in workers),
        *((o.name, "api", 8000, "TCP") for o in others),
        # Names resolve everywhere.
        *((p, "dns", 53, proto) for p in ours for proto in ("UDP", "TCP")),
    }
    assert allowed == expected, (sorted(allowed - expected), sorted(expected - allowed))


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


def test_the_api_gets_predictions_from_the_predictor_service(rendered: list) -> None:
    """The api image has no torch: its model predictions come from `vramlab predictor`
    in the predictor image (the worker-cpu image's torch plus the server), behind a
    Service the API's settings name."""
    settings = named(rendered, "ConfigMap", "vramlab-settings")["data"]
    assert "VRAMLAB_MODEL_PREDICTIONS" not in settings  # predictions are on
    predictor = named(rendered, "Deployment", "vramlab-predictor")
    pod = predictor["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["image"].startswith("registry.example.org/vramlab/predictor:")
    args = build_parser().parse_args(c["args"][1:])
    assert args.command == "predictor"
    service = named(rendered, "Service", "vramlab-predictor")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port = service["spec"]["ports"][0]["port"]
    assert settings["VRAMLAB_PREDICTOR_URL"] == f"http://vramlab-predictor:{port}"
    assert args.port == port and "nvidia.com/gpu" not in c["resources"]["requests"]


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
        assert build_parser().parse_args(c["args"][1:]).device == "cuda"
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
