"""Build and run the project's container images with podman, as a user would (issue 28).

No image registry is reachable here, so every base is made locally: a Debian 12 minbase
from Debian's own archive (``mmdebstrap``, the same distribution as ``debian:12-slim``),
imported once and tagged by a hash of how it was made, so later tests and later runs on
the machine reuse it (podman's store is the cache; its layer cache spares rebuilds too).
Builds reach the package index through the host's CA bundle and pip configuration,
mounted read-only, with the host's network; containers run on their own network.

podman is driven with ``runc``, the cgroupfs manager and no default rlimits (the sandbox
refuses them), all from one ``containers.conf`` this module writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import REPO, free_port

CACHE = Path(os.environ.get("EMBER_IMAGE_CACHE", Path.home() / ".cache" / "ember-images"))
TOOLS = ("podman", "runc", "mmdebstrap")
# What the stand-in for debian:12-slim is made of: the tag hashes these, so a change here
# makes (and caches) a new base instead of reusing a stale one.
BASE_SUITE = "bookworm"
BASE_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_INCLUDE: tuple[str, ...] = ()
BUILD_TIMEOUT = 1500.0
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
WHEELS = Path("/opt/wheels")  # the torch CPU wheel lies here (the machine's pip finds it)
BUILD_DIR = "/run/ember-build"
BUILD_CA = f"{BUILD_DIR}/ca.crt"  # not /etc/ssl/certs: apt's ca-certificates writes there


class BuildFailed(RuntimeError):
    """An image did not build; the message ends with the build's last output."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def in_ci() -> bool:
    """CI must run the image tests: .ci/run installs the tools and sets EMBER_REQUIRE_IMAGES
    (CI's runner sets CI)."""
    flags = (os.environ.get(name, "").lower() for name in ("CI", "EMBER_REQUIRE_IMAGES"))
    return any(flag in ("1", "true", "yes") for flag in flags)


def _conf() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "containers.conf"
    text = (
        '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
        'cgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
    )
    if not conf.exists() or conf.read_text() != text:
        conf.write_text(text)
    return conf


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(_conf())}


def podman(*args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])}: {proc.stderr[-4000:]}")
    return proc


# What one run of the image tests takes on the disk at its peak: every image's
# rebuilt layers (the tree changes each commit), BentoML's and podman's copies while they
# commit a layer (in /var/tmp), and the bento itself: two full `.ci/run`s on the 2-core CI
# host took 7 and 12 GiB at their peak (59 -> 52 and 59 -> 47 GiB free, the clone's venv
# included); kept with room.
RUN_NEEDS_GIB = 20.0
TEST_TAGS = "localhost/ember-test"  # what the tests build; the bases are kept (slow to make)


def _free_gib() -> dict[str, float]:
    """Free space where podman stores images and where it stages a layer (image_copy_tmp_dir,
    /var/tmp by default): one full disk there fails a build half-way."""
    root = podman("info", "--format", "{{.Store.GraphRoot}}").stdout.strip()
    return {place: shutil.disk_usage(place).free / 2**30 for place in (root, "/var/tmp")}


def _short_of(needs_gib: float) -> bool:
    return min(_free_gib().values()) < needs_gib


def reclaim(needs_gib: float = RUN_NEEDS_GIB) -> None:
    """Make room before building, clearing the least useful first: stopped containers;
    then, where less than twice ``needs_gib`` is free, untagged images (what builds before
    image_id()/drop_replaced() left, but also the layer cache of the Dockerfile's inner
    stages: the next build of those is cold, so only when room runs short); then, where
    still short of ``needs_gib``, the test images (rebuilt cold). Fails here, saying how much
    is free where, when even that is short, not half-way through a build."""
    podman("container", "prune", "--force", timeout=300, check=False)
    if _short_of(2 * needs_gib):
        podman("image", "prune", "--force", timeout=900, check=False)
    if _short_of(needs_gib):
        tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}", TEST_TAGS, check=False)
        for tag in tags.stdout.split():
            podman("rmi", "--force", tag, timeout=300, check=False)
        podman("image", "prune", "--force", timeout=900, check=False)
    short = {place: round(gib, 1) for place, gib in _free_gib().items() if gib < needs_gib}
    if short:
        raise RuntimeError(
            f"the image tests need {needs_gib:.0f} GiB free; after clearing old images only "
            f"{short} GiB is (see `podman system df`, `df -h`)"
        )


def image_id(tag: str) -> str | None:
    """The image ``tag`` names now, if any."""
    found = podman("image", "inspect", "--format", "{{.Id}}", tag, check=False)
    return found.stdout.strip() if found.returncode == 0 else None


def drop_replaced(tag: str, previous: str | None) -> None:
    """Remove the image ``tag`` named before a rebuild moved it (with the layers only it
    used): each run rebuilds every test image, and what it replaced is dead weight."""
    if previous is not None and previous != image_id(tag):
        podman("rmi", previous, timeout=300, check=False)


def _pip_conf() -> Path:
    conf = CACHE / "pip.conf"
    lines = ["[global]", f"cert = {BUILD_CA}"]
    if WHEELS.is_dir():
        lines.append(f"find-links = {WHEELS}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


# What debian:12-slim leaves out (debuerreotype's slimify: the path excludes its dpkg
# configuration keeps), for the stand-in of the slim CPU image, whose size is checked.
SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/man/*",
)


def slim_base_image() -> str:
    """The stand-in for debian:12-slim with slim's path excludes: the base of the image
    whose size the suite holds to its ceiling (the other images keep ``base_image``)."""
    return base_image(SLIM_DPKG_OPTIONS)


def base_image(dpkg_options: Sequence[str] = ()) -> str:
    """The Debian 12 minbase stand-in for debian:12-slim, made once per machine."""
    spec = json.dumps([BASE_SUITE, BASE_MIRRORS, BASE_INCLUDE, *dpkg_options])
    tag = f"localhost/ember-test-base:{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    CACHE.mkdir(parents=True, exist_ok=True)
    tar = CACHE / f"{tag.rsplit(':', 1)[1]}.tar"
    include = [f"--include={','.join(BASE_INCLUDE)}"] if BASE_INCLUDE else []
    include += [f"--dpkgopt={option}" for option in dpkg_options]
    subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=minbase", *include, BASE_SUITE, str(tar),
         *BASE_MIRRORS],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    try:
        podman("import", "--quiet", str(tar), tag, timeout=300)
    finally:
        tar.unlink(missing_ok=True)
    return tag


def build_volumes() -> list[str]:
    """What a build reaches the package index with: the machine's CA bundle and pip
    configuration, and the directory of local wheels that configuration names."""
    mounts = {_pip_conf(): "/etc/pip.conf"}
    if HOST_CA.exists():
        mounts[HOST_CA] = BUILD_CA
    if WHEELS.is_dir():
        mounts[WHEELS] = str(WHEELS)
    return [f"{source}:{target}:ro" for source, target in mounts.items()]


def build_dir() -> Path:
    """The same in one directory, for a builder that takes one volume (BentoML's podman
    backend joins repeated volumes into one argument): the CA bundle, a pip configuration
    and the local wheels (hard links), mounted at /run/ember-build."""
    root = CACHE / "build"
    (root / "wheels").mkdir(parents=True, exist_ok=True)
    if HOST_CA.exists():
        shutil.copyfile(HOST_CA, root / "ca.crt")
    for wheel in sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []:
        target = root / "wheels" / wheel.name
        if not target.exists():
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
    lines = ["[global]", f"find-links = {BUILD_DIR}/wheels"]
    if HOST_CA.exists():
        lines.append(f"cert = {BUILD_CA}")
    (root / "pip.conf").write_text("\n".join(lines) + "\n")
    return root


def build_dir_env() -> dict[str, str]:
    """What pip and uv read from build_dir(), as build environment (uv reads no pip
    configuration; BentoML's images install with it). Also written into the image's config,
    which is acceptable for a test image only."""
    env = {"PIP_CONFIG_FILE": f"{BUILD_DIR}/pip.conf", "UV_FIND_LINKS": f"{BUILD_DIR}/wheels"}
    if HOST_CA.exists():
        env["SSL_CERT_FILE"] = BUILD_CA
    return env


def size_of(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


@dataclass(frozen=True)
class Built:
    tag: str
    seconds: float
    size_bytes: int


def build(
    tag: str,
    dockerfile: Path | str = "Dockerfile",
    *,
    context: Path = REPO,
    build_args: Mapping[str, str] | None = None,
    target: str | None = None,
    timeout: float = BUILD_TIMEOUT,
    volumes: Sequence[str] | None = None,
    layers: bool = True,
) -> Built:
    """``podman build`` as ``docker build`` would run it, in Docker's image format (OCI
    drops HEALTHCHECK), of ``target`` (a stage) where named, with ``volumes`` (default
    ``build_volumes()``). ``layers=False`` keeps no step's image (a build meant to fail leaves
    none behind, holding the image it starts from). Raises BuildFailed with the output tail."""
    args = ["build", "--format", "docker", "--network", "host", "-f", str(dockerfile), "-t", tag]
    if target:
        args += ["--target", target]
    if not layers:
        args.append("--layers=false")
    for volume in build_volumes() if volumes is None else volumes:
        args += ["-v", volume]
    for key, value in (build_args or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    previous = image_id(tag)
    start = time.monotonic()
    proc = subprocess.run(
        ["podman", *args, str(context)],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise BuildFailed(f"{tag} did not build:\n{(proc.stdout + proc.stderr)[-6000:]}")
    drop_replaced(tag, previous)
    return Built(tag, seconds, size_of(tag))


def image_config(tag: str) -> dict:
    return json.loads(podman("image", "inspect", tag).stdout)[0]


@dataclass
class Container:
    cid: str
    url: str | None
    started: float
    ready_after: float = 0.0

    def logs(self) -> str:
        proc = podman("logs", self.cid, check=False)
        return (proc.stdout + proc.stderr)[-8000:]

    def exec(self, *cmd: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return podman("exec", self.cid, *cmd, timeout=timeout, check=False)

    def inside(self, port: int, path: str, body: object | None = None) -> tuple[int, object]:
        """A request from inside the container (``--network none`` has no other way in)."""
        script = (
            "import json, sys, urllib.error, urllib.request\n"
            "url, body = sys.argv[1], sys.argv[2]\n"
            "data = body.encode() if body else None\n"
            "req = urllib.request.Request(url, data=data, "
            "headers={'content-type': 'application/json'})\n"
            "try:\n    r = urllib.request.urlopen(req, timeout=30)\n"
            "except urllib.error.HTTPError as e:\n    r = e\n"
            "print(json.dumps([r.status, json.loads(r.read() or b'null')]))\n"
        )
        payload = json.dumps(body) if body is not None else ""
        url = f"http://127.0.0.1:{port}{path}"
        proc = self.exec("python3", "-c", script, url, payload)
        assert proc.returncode == 0, proc.stderr[-2000:]
        status, answer = json.loads(proc.stdout.strip().splitlines()[-1])
        return int(status), answer

    def stop(self, timeout: int = 30) -> int:
        """``podman stop``: SIGTERM (the image's STOPSIGNAL), then the exit code."""
        podman("stop", "--time", str(timeout), self.cid, timeout=timeout + 30)
        state = podman("inspect", "--format", "{{.State.ExitCode}}", self.cid).stdout
        return int(state.strip())


@contextlib.contextmanager
def running(
    tag: str,
    args: Sequence[str] = (),
    *,
    port: int | None,
    ready_path: str,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
) -> Iterator[Container]:
    """``podman run -d`` the image, publishing ``port`` on 127.0.0.1 (None: no network,
    readiness polled from inside); yield once ``ready_path`` answers 200."""
    opts = list(options)
    host_port = None
    if port is not None:
        host_port = free_port()
        opts += ["-p", f"127.0.0.1:{host_port}:{port}"]
    for key, value in (env or {}).items():
        opts += ["-e", f"{key}={value}"]
    start = time.monotonic()
    cid = podman("run", "-d", *opts, tag, *args, timeout=120).stdout.strip().splitlines()[-1]
    url = f"http://127.0.0.1:{host_port}" if host_port else None
    box = Container(cid, url, start)
    try:
        _wait(box, port, ready_path, timeout)
        yield box
    finally:
        podman("rm", "--force", "--time", "5", cid, check=False, timeout=60)


def _wait(box: Container, port: int | None, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running_now = podman("inspect", "--format", "{{.State.Running}}", box.cid).stdout
        if running_now.strip() != "true":
            raise AssertionError(f"container exited before ready:\n{box.logs()}")
        try:
            if box.url is not None:
                ok = httpx.get(box.url + path, timeout=5).status_code == 200
            else:
                ok = box.inside(port or 7997, path)[0] == 200
        except (httpx.HTTPError, AssertionError):
            ok = False
        if ok:
            box.ready_after = time.monotonic() - box.started
            return
        time.sleep(0.5)
    raise AssertionError(f"not ready within {timeout:.0f} s:\n{box.logs()}")
