"""deploy/kubernetes/*.yaml against the app they deploy (issue 28).

A manifest that probes a route the app does not have, a port it does not listen on, a
user the image does not run as or a metric it does not export fails only on a cluster,
at the worst time; these checks read the real route table, settings and /metrics.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.support import REPO

MANIFESTS = REPO / "deploy" / "kubernetes"
DOC = REPO / "docs" / "deploy" / "kubernetes.md"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / name).read_text())


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


def test_every_manifest_parses_and_names_its_kind() -> None:
    kinds = {yaml.safe_load(p.read_text()).get("kind") for p in MANIFESTS.glob("*.yaml")}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds


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
    (rule,) = load("prometheus-adapter-rules.yaml")["rules"]["custom"]
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
    for path in sorted(MANIFESTS.glob("*.yaml")):
        assert f"deploy/kubernetes/{path.name}" in text, path.name
