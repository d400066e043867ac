"""Images per second through the engine, torch against ONNX Runtime, on a CLIP directory.

    PYTHONPATH=. .venv/bin/python benchmarks/media_models.py clip-vit-b32 /tmp/clip-b32
    PYTHONPATH=.:core .venv/bin/python benchmarks/media_backends.py /tmp/clip-b32 \\
        --variants torch:float32 onnx:float32 onnx:int8 --rounds 3

Each run is a fresh process (one backend's imports and heap only) that loads the model
through the normal path (``EngineArray``, ``--device cpu``), warms up, then sends distinct
224x224 JPEG data URIs the way the issue's benchmark does: 8 per request at concurrency
4, then 1 per request at concurrency 16. The variants alternate round by round, so a
neighbour's load on a shared machine falls on all of them alike. Prints one JSON line per
run and a summary (median images/s and CPU ms per image, per variant and load).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOADS = ((8, 4), (1, 16))  # (images per request, concurrent clients)


def jpeg_uris(count: int, seed: int = 0) -> list[str]:
    """Distinct 224x224 JPEGs (noise over a gradient) as data URIs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:224, 0:224]
    uris = []
    for i in range(count):
        base = np.stack([xs + i, ys * 2 - i, (xs + ys + 7 * i) % 256], axis=-1) % 256
        pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
        uris.append("data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode())
    return uris


async def _load(
    engine: object, uris: list[str], per_request: int, clients: int
) -> tuple[float, float]:
    """Images per second of ``clients`` loops, each sending its share in requests, and this
    process's CPU milliseconds per image (user + system, every thread): on a shared machine
    the second depends less on the neighbours' load than the first."""
    from ember.engine import EmbedRequest

    requests = [uris[i : i + per_request] for i in range(0, len(uris), per_request)]
    queue = list(reversed(requests))

    async def client() -> None:
        while queue:
            await engine.embed(EmbedRequest(queue.pop(), modality="image"))  # type: ignore[attr-defined]

    cpu, started = _cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    return len(uris) / wall, 1000 * (_cpu_seconds() - cpu) / len(uris)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(path: str, backend: str, dtype: str, images: int, cache: str) -> dict:
    from ember.config import settings_from_env
    from ember.engine import EmbedRequest
    from ember.engine.array import EngineArray

    settings = settings_from_env(
        model_id=[path], backend=backend, dtype=dtype, device="cpu", cache_dir=cache
    )
    started = time.perf_counter()
    engines = EngineArray(settings.model_specs())
    await engines.start()
    ready = time.perf_counter() - started
    engine = engines.engines[0]
    uris = jpeg_uris(images)
    await engine.embed(EmbedRequest(uris[:8], modality="image"))  # past the warm-up's shapes
    result = {"backend": backend, "dtype": dtype, "ready_s": round(ready, 1)}
    for per_request, clients in LOADS:
        rate, cpu_ms = await _load(engine, uris, per_request, clients)
        result[f"{per_request}x{clients}"] = round(rate, 2)
        result[f"{per_request}x{clients}_cpu_ms"] = round(cpu_ms, 1)
    result["info"] = engine.backend.info.details  # type: ignore[attr-defined]
    await engines.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a CLIP or SigLIP directory")
    parser.add_argument("--variants", nargs="+", default=["torch:float32", "onnx:float32"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--cache-dir", default="/tmp/ember-media-bench-cache")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's backend:dtype
    parser.add_argument("--json", type=Path, help="also write the runs and summary here")
    args = parser.parse_args()
    if args.one:
        backend, dtype = args.one.split(":")
        result = asyncio.run(_run(args.model, backend, dtype, args.images, args.cache_dir))
        print(json.dumps(result), flush=True)
        return
    runs = []
    for round_ in range(args.rounds):
        order = args.variants if round_ % 2 == 0 else list(reversed(args.variants))
        for variant in order:
            argv = [sys.executable, __file__, args.model, "--one", variant]
            argv += ["--images", str(args.images), "--cache-dir", args.cache_dir]
            out = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
            if out.returncode != 0:
                sys.exit(f"{variant} failed:\n{out.stderr[-3000:]}")
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["round"] = round_
            run["loadavg"] = os.getloadavg()[0]
            print(json.dumps(run), flush=True)
            runs.append(run)
    summary = {
        variant: {
            load: statistics.median(
                r[load] for r in runs if f"{r['backend']}:{r['dtype']}" == variant
            )
            for load in (f"{n}x{c}{unit}" for n, c in LOADS for unit in ("", "_cpu_ms"))
        }
        for variant in args.variants
    }
    print(json.dumps({"medians": summary}), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
