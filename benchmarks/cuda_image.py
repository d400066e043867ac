"""The CUDA image for real: ``Dockerfile --target cuda`` with PyPI's CUDA torch wheel and
onnxruntime-gpu, built here once, started on this GPU-less machine, measured.

    PYTHONPATH=core:. .venv/bin/python benchmarks/cuda_image.py

The suite builds the same stage on torch's CPU wheel (``test_images``: neither a GPU nor a
multi-GB download belongs in CI); this is the image users pull. Reported: the build's wall
time, the image size as ``podman image inspect`` gives it and per layer, the largest
packages inside, the start-up line that says no GPU is visible, start -> ready, and one
answer (the packaged MiniLM on the CPU, compared with sentence-transformers). Written to
benchmarks/results/<date>-cuda-image.{md,json}; nothing here asserts a host's speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np

from tests.platforms import images

RESULTS = Path(__file__).parent / "results"
TAG = "localhost/ember:cuda"
TEXTS = ["A CUDA image on a machine with no GPU.", "It serves on the CPU and says so."]
NO_GPU_LINE = "no GPU visible"


def _index_only() -> list[str]:
    """The build reaches PyPI as a user's would: the CA bundle and a pip configuration
    without this machine's local wheels (whose torch 2.13.0+cpu would satisfy the
    stage's ``torch==2.13.0`` and make a CPU image)."""
    conf = images.CACHE / "pip-index-only.conf"
    conf.write_text(f"[global]\ncert = {images.BUILD_CA}\n")
    volumes = [f"{conf}:/etc/pip.conf:ro"]
    if images.HOST_CA.exists():
        volumes.append(f"{images.HOST_CA}:{images.BUILD_CA}:ro")
    return volumes


def _layers(tag: str) -> list[tuple[int, str]]:
    """(bytes, the instruction that made it) per layer, largest first."""
    out = images.podman("history", "--format", "json", "--no-trunc", tag).stdout
    rows = [(int(row.get("size") or 0), str(row.get("CreatedBy", ""))) for row in json.loads(out)]
    return sorted(((size, cmd[-140:]) for size, cmd in rows if size), reverse=True)


def _packages(box: images.Container) -> list[tuple[int, str]]:
    """The largest directories in the image's site-packages, in bytes."""
    script = (
        "import os, site, sys\n"
        "root = [p for p in site.getsitepackages() if p.startswith('/opt/venv')][0]\n"
        "for name in os.listdir(root):\n"
        "    total = 0\n"
        "    for base, _, files in os.walk(os.path.join(root, name)):\n"
        "        total += sum(os.path.getsize(os.path.join(base, f)) for f in files\n"
        "                     if not os.path.islink(os.path.join(base, f)))\n"
        "    print(total, name)\n"
    )
    proc = box.exec("python3", "-c", script, timeout=120)
    rows = [line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line]
    return sorted(((int(size), name) for size, name in rows), reverse=True)[:12]


def _reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    from ember.models.resolve import default_model_path

    model = SentenceTransformer(str(default_model_path()), device="cpu")
    return model.encode(TEXTS, normalize_embeddings=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the image afterwards")
    args = parser.parse_args()
    base = images.slim_base_image()
    built = images.build(
        TAG, build_args={"BASE_IMAGE": base}, target="cuda", timeout=3600, volumes=_index_only()
    )
    report: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "tag": TAG,
        "base": base,
        "build_seconds": round(built.seconds, 1),
        "size_bytes": built.size_bytes,
        "layers": _layers(TAG),
    }
    with images.running(TAG, port=7997, ready_path="/ready", timeout=600) as box:
        assert box.url is not None
        report["ready_after_s"] = round(box.ready_after, 2)
        resp = httpx.post(f"{box.url}/v1/embeddings", json={"input": TEXTS}, timeout=120)
        resp.raise_for_status()
        got = np.array([row["embedding"] for row in resp.json()["data"]])
        want = _reference()
        cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        report["min_cosine_vs_sentence_transformers"] = round(float(cosines.min()), 7)
        models = httpx.get(f"{box.url}/v1/models", timeout=30).json()["data"]
        report["served_by"] = {m["id"]: m.get("backend_details", m.get("backend")) for m in models}
        logs = box.logs()
        report["no_gpu_lines"] = [line for line in logs.splitlines() if NO_GPU_LINE in line]
        versions = box.exec("pip", "list", "--format", "json")
        wanted = ("torch", "onnxruntime-gpu", "onnxruntime", "transformers", "numpy")
        report["versions"] = {
            p["name"]: p["version"]
            for p in json.loads(versions.stdout or "[]")
            if p["name"] in wanted or p["name"].startswith("nvidia-")
        }
        report["largest_packages"] = _packages(box)
        report["exit_on_sigterm"] = box.stop()
    if not args.keep:
        images.podman("rmi", TAG, check=False, timeout=300)
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"{report['date'][:10]}-cuda-image"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(_markdown(report))
    print(stem.with_suffix(".md").read_text())
    cuda_torch = "+cpu" not in report["versions"].get("torch", "+cpu")
    cuda_libs = any(name.startswith("nvidia-") for name in report["versions"])
    return 0 if len(report["no_gpu_lines"]) == 1 and cuda_torch and cuda_libs else 1


def _markdown(r: dict) -> str:
    mib = 1024 * 1024
    lines = [
        f"# The CUDA image, built here ({r['date']})",
        "",
        "`PYTHONPATH=core:. .venv/bin/python benchmarks/cuda_image.py`: `Dockerfile --target "
        "cuda` with its default `TORCH_WHEEL=cuda` (PyPI's CUDA torch and onnxruntime-gpu), on the "
        f"suite's debian:12-slim stand-in (`{r['base']}`), started on this GPU-less host.",
        "",
        f"- size: **{r['size_bytes'] / 1e9:.2f} GB** ({r['size_bytes']:,} bytes, "
        f"{r['size_bytes'] / mib:,.0f} MiB, `podman image inspect`)",
        f"- build: {r['build_seconds']:.0f} s (downloads included)",
        f"- start -> /ready: {r['ready_after_s']} s; SIGTERM exit code {r['exit_on_sigterm']}",
        f"- served by: `{json.dumps(r['served_by'])}`",
        "- cosine to sentence-transformers (fp32, CPU): "
        f"{r['min_cosine_vs_sentence_transformers']}",
        "- the start-up line:",
        "",
        *[f"      {line}" for line in r["no_gpu_lines"]],
        "",
        "## Layers (largest first)",
        "",
        "| MB | made by |",
        "|---:|---|",
        *[f"| {size / 1e6:,.1f} | `{cmd.replace('|', '/')}` |" for size, cmd in r["layers"][:8]],
        "",
        "## Largest packages in the venv",
        "",
        "| MB | package |",
        "|---:|---|",
        *[f"| {size / 1e6:,.1f} | {name} |" for size, name in r["largest_packages"]],
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(r["versions"].items())),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
