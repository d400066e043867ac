"""deploy/kubernetes/ against the app it deploys and the clusters it goes to.

A manifest that probes a route the app does not have, a port it does not listen on, a
user the image does not run as or a metric it does not export fails only on a cluster,
at the worst time; these checks read the real route table, settings and /metrics. The
base and each overlay are rendered as `kubectl apply -k` renders them (kubectl's own
kustomize, offline), validated against the Kubernetes API schemas of 1.29 to 1.37
(kubernetes-validate, strict), and held to the "restricted" Pod Security Standard.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.support import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
MANIFESTS = KUBERNETES / "base"
OVERLAYS = ("servicemonitor", "keda")
DOC = REPO / "docs" / "deploy" / "kubernetes.md"
# The API versions the manifests must validate against (oldest supported to newest).
VERSIONS = ("1.29.0", "1.33.0", "1.37.0")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / name).read_text())


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k DIRECTORY` would apply (kubectl's kustomize, offline)."""
    kubectl = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


@pytest.fixture(scope="module")
def app_facts(minilm_path: Path) -> dict[str, Any]:
    """The routes and /metrics of the app `ember serve` builds (models not loaded)."""
    from ember.api.app import create_app
    from ember.config import ServerSettings

    settings = ServerSettings(model_id=str(minilm_path), backend="torch")
    app = create_app(settings)
    routes = {getattr(r, "path", "") for r in app.routes}
    with TestClient(app) as client:  # the lifespan loads the model: /ready turns 200
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        metrics = client.get("/metrics").text
        statuses = {path: client.get(path).status_code for path in ("/ready", "/livez")}
    return {"routes": routes, "metrics": metrics, "port": settings.port, "statuses": statuses}


@pytest.fixture(scope="module")
def container() -> dict[str, Any]:
    return load("deployment.yaml")["spec"]["template"]["spec"]["containers"][0]


BASE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """The base (`kubectl apply -k deploy/kubernetes`) and each overlay, rendered."""
    out = {"base": kustomize(KUBERNETES)}
    out.update({name: kustomize(KUBERNETES / "overlays" / name) for name in OVERLAYS})
    return out


def test_apply_k_renders_the_base_and_every_overlay(rendered: dict[str, Any]) -> None:
    assert [o["kind"] for o in rendered["base"]].count("Deployment") == 1
    assert set(by_kind(rendered["base"])) == BASE_KINDS
    assert set(by_kind(rendered["servicemonitor"])) == BASE_KINDS | {"ServiceMonitor"}
    # KEDA owns an HPA of its own: the overlay drops the base's
    keda = set(by_kind(rendered["keda"]))
    assert keda == BASE_KINDS - {"HorizontalPodAutoscaler"} | {"ScaledObject"}
    # every manifest file is applied by the base: none is left out of the kustomization
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert len(files) == len(rendered["base"])


def test_the_core_objects_validate_against_the_api_schemas(rendered: dict[str, Any]) -> None:
    import kubernetes_validate

    core = [o for objects in rendered.values() for o in objects if o["kind"] in BASE_KINDS]
    for version in VERSIONS:
        for obj in core:
            kubernetes_validate.validate(obj, version, strict=True)
    broken = copy.deepcopy(by_kind(rendered["base"])["Deployment"])
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccomp"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


# The "restricted" Pod Security Standard (kubernetes.io/docs/concepts/security/
# pod-security-standards), the rules a pod spec can break: what the admission controller
# refuses where a namespace enforces the level.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in ``pod`` (a pod spec) breaks the restricted level; empty where it is met."""
    found = [flag for flag in ("hostNetwork", "hostPID", "hostIPC") if pod.get(flag)]
    pod_context = pod.get("securityContext", {})
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for c in containers:
        ctx = c.get("securityContext", {})
        name = c["name"]
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        if not ctx.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name}: runs as uid 0")
        seccomp = ctx.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{name}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount")
    unsafe = {s["name"] for s in pod_context.get("sysctls", [])} - {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
    }  # fmt: skip
    found += [f"sysctl {name}" for name in sorted(unsafe)]
    return found


def test_the_pod_meets_the_restricted_pod_security_level(rendered: dict[str, Any]) -> None:
    for name, objects in rendered.items():
        pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
        assert restricted_violations(pod) == [], name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the checker itself refuses what the admission controller would
    pod = copy.deepcopy(by_kind(rendered["base"])["Deployment"]["spec"]["template"]["spec"])
    del pod["securityContext"]["seccompProfile"]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    assert len(restricted_violations(pod)) == 3, restricted_violations(pod)


def test_the_pod_stays_offline_and_has_a_cpu_limit_for_its_threads(
    container: dict[str, Any],
) -> None:
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    # the cgroup quota a CPU limit sets is what Ember sizes its threads from (ember.cpu)
    assert container["resources"]["limits"]["cpu"] == container["resources"]["requests"]["cpu"]


def test_the_overlays_scrape_and_scale_on_what_the_app_exports(
    rendered: dict[str, Any], app_facts: dict[str, Any]
) -> None:
    monitor = by_kind(rendered["servicemonitor"])["ServiceMonitor"]
    service = by_kind(rendered["servicemonitor"])["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] in app_facts["routes"]
    scaled = by_kind(rendered["keda"])["ScaledObject"]
    deployment = by_kind(rendered["keda"])["Deployment"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    metric = re.match(r"sum\((\w+)\{", trigger["metadata"]["query"])
    assert metric is not None and f"# TYPE {metric.group(1)} gauge" in app_facts["metrics"]
    hpa = load("hpa.yaml")["spec"]
    assert int(trigger["metadata"]["threshold"]) == int(
        hpa["metrics"][0]["pods"]["target"]["averageValue"]
    )
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
        hpa["minReplicas"],
        hpa["maxReplicas"],
    )


def test_probes_hit_real_routes_on_the_served_port(
    container: dict[str, Any], app_facts: dict[str, Any]
) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": app_facts["port"]}
    assert "EMBER_PORT" not in {e["name"] for e in container.get("env", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]["httpGet"]
        assert probe["path"] in app_facts["routes"], (kind, probe)
        assert probe["port"] in ports or probe["port"] == app_facts["port"]
        assert app_facts["statuses"][probe["path"]] == 200, (kind, app_facts["statuses"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_the_service_and_the_scrape_annotations_use_the_same_port(
    container: dict[str, Any], app_facts: dict[str, Any]
) -> None:
    service = load("service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    template = load("deployment.yaml")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == app_facts["port"]
    assert annotations["prometheus.io/path"] in app_facts["routes"]
    selector = load("deployment.yaml")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert load("pdb.yaml")["spec"]["selector"]["matchLabels"] == selector


def test_the_autoscaler_metric_is_one_the_app_exports(app_facts: dict[str, Any]) -> None:
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == load("deployment.yaml")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert f"# TYPE {name} gauge" in app_facts["metrics"]
    values = yaml.safe_load((KUBERNETES / "helm" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{") and rule["name"]["as"] == name


def test_the_pod_runs_as_the_image_user_with_the_keys_file_from_a_secret(
    container: dict[str, Any],
) -> None:
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert user is not None
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    assert pod["securityContext"]["runAsGroup"] == int(user.group(2))
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = container["args"]
    keys_file = Path(args[args.index("--api-keys-file") + 1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    secret = next(v for v in pod["volumes"] if "secret" in v)
    mount = mounts[secret["name"]]
    assert mount["readOnly"] is True and keys_file.parent == Path(mount["mountPath"])
    assert keys_file.name in {item["path"] for item in secret["secret"]["items"]}
    assert any(m["mountPath"] == "/tmp" for m in mounts.values())  # the named tmpfs
    # terminationGracePeriodSeconds covers the preStop pause and the 10 s drain
    assert pod["terminationGracePeriodSeconds"] >= 5 + 10


def test_the_doc_shows_every_manifest() -> None:
    text = DOC.read_text()
    for path in sorted(KUBERNETES.rglob("*.yaml")):
        assert str(path.relative_to(REPO)) in text, path.name
    assert "kubectl apply -k deploy/kubernetes" in text
    # nothing in the base's folder that `kubectl apply -f` would refuse: only objects
    for path in MANIFESTS.glob("*.yaml"):
        assert {"apiVersion", "kind"} <= set(yaml.safe_load(path.read_text())), path.name
