"""Ready to publish: the licence, the wheel and sdist as a release builds them, the torch-free
install made from that wheel serving, OCI labels on every image, the release workflow
(actionlint) and install hints that name extras which exist.

The wheel goes into a fresh venv with only its ``cpu`` extra (pip, from the configured
indexes): torch and transformers are never installed there, and the server it runs answers
at the default this host's CPU gets (OpenVINO bf16 where it multiplies bf16 natively and
the probe holds, else ONNX Runtime fp32), within that tier's tolerance of torch's vectors.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import yaml

from ember import cpu
from tests.fixtures.graph_serving import check_served, serve_graphs, torch_reference
from tests.platforms.test_dockerfiles import DOCKERFILES, instructions
from tests.support import REPO, ServerProcess, child_env

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS_REQS = PROJECT["optional-dependencies"]
EXTRAS = set(EXTRAS_REQS)
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
# What the lean venv must not hold: the torch-free install's point.
HEAVY = ("torch", "transformers", "sentence-transformers", "scipy", "scikit-learn")


def test_the_licence_is_the_apache_2_0_the_project_names() -> None:
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000  # the whole text


def test_install_hints_name_extras_that_exist() -> None:
    """Every `ember[...]` a message, the README or a doc tells a user to install exists."""
    sources = [*(REPO / "core").rglob("*.py"), REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    sources += [REPO / "Makefile", *(REPO / "platforms").rglob("*.py")]
    named: dict[str, set[str]] = {}
    for path in sources:
        for group in re.findall(r"ember\[([a-z0-9,-]+)\]", path.read_text(errors="replace")):
            for extra in group.split(","):
                named.setdefault(extra, set()).add(str(path.relative_to(REPO)))
    assert {"cpu", "export"} <= set(named), sorted(named)
    missing = {extra: sorted(paths) for extra, paths in named.items() if extra not in EXTRAS}
    assert not missing, missing
    # the backend table's hints too: each names an extra that installs its runtime
    from ember.backend_table import REGISTRY

    for entry in REGISTRY.values():
        assert not entry.extra or entry.extra in EXTRAS, entry
    assert {"onnxruntime", "openvino"} <= {_name(r) for r in EXTRAS_REQS["cpu"]}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_cpu_extra_pulls_neither_torch_nor_transformers() -> None:
    cpu_closure = {_name(r) for r in PROJECT["dependencies"] + EXTRAS_REQS["cpu"]}
    assert not cpu_closure & set(HEAVY), cpu_closure & set(HEAVY)
    assert {"torch", "transformers"} <= {_name(r) for r in EXTRAS_REQS["export"]}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_image_carries_oci_labels(dockerfile: Path) -> None:
    steps = instructions(dockerfile.read_text())
    args = dict(r.split("=", 1) for k, r in steps if k == "ARG" and "=" in r)
    labels = " ".join(r for k, r in steps if k == "LABEL")
    for key in ("version", "source", "licenses", "revision", "title"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert args["VERSION"] == PROJECT["version"]
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    assert 'version="${VERSION}"' in labels and 'source="${SOURCE}"' in labels


def test_the_release_workflow_passes_actionlint_and_builds_what_exists() -> None:
    linter = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    done = subprocess.run(
        [linter, "-no-color", str(WORKFLOW)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the linter fails a broken workflow (so the check above can fail)
    broken = WORKFLOW.read_text().replace("runs-on: ubuntu-24.04", "runs-on: [", 1)
    done = subprocess.run(
        [linter, "-no-color", "-"], input=broken, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert {"dist", "pypi", "images"} <= set(jobs)
    stages = {
        rest.split()[-1]
        for kind, rest in instructions((REPO / "Dockerfile").read_text())
        if kind == "FROM" and " AS " in rest.upper()
    }
    targets = {row["target"] for row in jobs["images"]["strategy"]["matrix"]["include"]}
    assert targets == {"cpu", "cuda"} and targets <= stages, (targets, stages)
    build = next(s for s in jobs["images"]["steps"] if "build-push-action" in s.get("uses", ""))
    passed = {line.split("=")[0] for line in build["with"]["build-args"].splitlines()}
    assert passed == {"VERSION", "REVISION", "SOURCE"}
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing


# ------------------------------------------------------------------ wheel, sdist, venv


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``python -m build`` (wheel and sdist) over the files a release checks out."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "core", source / "core", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_and_sdist_carry_the_package_and_its_licence(dists: dict[str, Path]) -> None:
    version = PROJECT["version"]
    assert dists["wheel"].name == f"ember-{version}-py3-none-any.whl"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        meta = wheel.read(f"ember-{version}.dist-info/METADATA").decode()
    assert f"ember-{version}.dist-info/licenses/LICENSE" in names
    assert {"ember/cli.py", "ember/backends/near_exact.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    assert "License-Expression: Apache-2.0" in meta
    assert {"cpu", "export"} <= set(re.findall(r"^Provides-Extra: (\S+)$", meta, re.M))
    required = [r for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M) if "extra ==" not in r]
    assert not {_name(r) for r in required} & set(HEAVY), required
    with tarfile.open(dists["sdist"]) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    assert {"LICENSE", "pyproject.toml", "README.md", "core/ember/cli.py"} <= members


@pytest.fixture(scope="module")
def lean_venv(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its ``cpu`` extra, nothing else."""
    root = tmp_path_factory.mktemp("lean") / "venv"
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{dists['wheel']}[cpu]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return root


def test_the_lean_venv_holds_no_torch(lean_venv: Path) -> None:
    listed = subprocess.run(
        [str(lean_venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    installed = {_name(line) for line in listed.splitlines()}
    assert {"ember", "onnxruntime", "onnx", "openvino"} <= installed
    assert not installed & set(HEAVY), installed & set(HEAVY)
    size = sum(f.stat().st_size for f in lean_venv.rglob("*") if f.is_file())
    print(f"\nlean venv (wheel + ember[cpu]): {size / 2**20:.0f} MiB")


@pytest.fixture(scope="module")
def lean_server(
    lean_venv: Path, minilm_graphs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    cache = tmp_path_factory.mktemp("lean-cache")
    env = child_env(drop_prefixes=("EMBER_",))
    env.pop("PYTHONPATH")  # the venv's own ember, from the wheel: not this checkout's
    env["EMBER_CACHE_DIR"] = str(cache)
    yield from serve_graphs([str(lean_venv / "bin" / "ember")], minilm_graphs, env, cache / "log")


def test_the_wheel_serves_the_host_default_torch_free(
    lean_server: ServerProcess, minilm_path: Path
) -> None:
    expected = ("openvino", "bfloat16") if cpu.native_bf16() else ("onnx", "float32")
    check_served(lean_server, torch_reference(minilm_path), expected)
