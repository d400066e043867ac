"""Images and audio: Ember vs Infinity 0.0.78 (torch engine) on CPU, in one session.

The issue's benchmark (issue 11): a ViT-B/32-sized CLIP (openai/clip-vit-base-patch32's
config, seeded random weights: real compute, meaningless vectors) and a CLAP with
laion/clap-htsat-unfused's config, both built by tests/fixtures/media_models.py into
results/tmp. Both servers load the *same* directory, offline. Loads, each bounded in count
and time, loopback only (benchmarks/loadgen.py):

    (i8) 8 images/request, concurrency 4     224x224 JPEG data URIs, /v1/embeddings
    (i1) 1 image/request, concurrency 16     with "modality": "image" (Infinity's
    (a3) 3 clips/request, concurrency 2      /embeddings takes the same body); CLAP clips
                                             are 5 s 48 kHz mono WAV data URIs

As run.py does, every server is started and warmed first, then each load is cut into
``--slices`` parts and the servers take turns part by part (the first server rotates), so
a burst of other work on this shared host hits both sides alike. A slice is one
measurement: the table gives the rate over all slices and the spread of the slice rates.

Fidelity: each server's vectors for the first images and clips of the pool against
transformers' ``get_image_features`` / ``get_audio_features`` in fp32 on the same decoded
inputs (Pillow RGB; soundfile + soxr), with the processor saved in the model directory.

    PYTHONPATH=core:. .venv/bin/python benchmarks/media.py             # both models
    PYTHONPATH=core:. .venv/bin/python benchmarks/media.py --quick     # smoke

The directories served carry no processor_config.json: transformers 5 writes one beside
the legacy preprocessor_config.json, and Infinity's transformers 4.48 then fails with
"CLIPProcessor.__init__() got multiple values for argument 'image_processor'"; without it
both versions load the same processor from preprocessor_config.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import loadgen  # noqa: E402
from benchmarks import run as harness  # noqa: E402

RESULTS = harness.RESULTS
TMP = harness.TMP
MODEL_NAME = harness.MODEL_NAME
IMAGE_POOL = 256  # distinct images; requests cycle through them
CLIP_POOL = 16  # distinct clips
CLIP_SECONDS = 5.0
COSINE_IMAGES = 16
COSINE_CLIPS = 4


@dataclass(frozen=True)
class MediaLoad:
    name: str
    modality: str  # "image" | "audio"
    per_request: int
    concurrency: int
    requests: int  # per server, over all slices
    description: str


LOADS: dict[str, MediaLoad] = {
    "i8": MediaLoad("i8", "image", 8, 4, 48, "8 images/request, concurrency 4"),
    "i1": MediaLoad("i1", "image", 1, 16, 384, "1 image/request, concurrency 16"),
    # 3 clips: 1.92 MB of base64, under Ember's default --payload-limit (2,000,000 bytes).
    "a3": MediaLoad("a3", "audio", 3, 2, 16, "3 clips (5 s, 48 kHz WAV)/request, concurrency 2"),
}


# --- models and inputs -------------------------------------------------------------------


def served_copy(built: Path) -> Path:
    """``built`` without processor_config.json (see the module doc), as symlinks."""
    out = built.with_name(built.name + "-served")
    out.mkdir(exist_ok=True)
    for item in built.iterdir():
        link = out / item.name
        if item.name != "processor_config.json" and not link.exists():
            link.symlink_to(item.resolve())
    return out


def build_models() -> dict[str, Path]:
    """The two models, built once into results/tmp (about 20 s and 1.2 GB)."""
    from tests.fixtures.media_models import build_clap_base, build_clip_vit_b32

    out = {}
    builds = (
        ("clip", "media-clip-vit-b32-seeded", build_clip_vit_b32),
        ("clap", "media-clap-htsat-unfused-seeded", build_clap_base),
    )
    for name, directory, build in builds:
        built = TMP / directory
        if not (built / "model.safetensors").exists():
            print(f"building {built} ...", file=sys.stderr, flush=True)
            build(built)
        out[name] = served_copy(built)
    return out


def image_uris(count: int) -> list[str]:
    from tests.fixtures.media_samples import benchmark_jpeg_uris

    return benchmark_jpeg_uris(count)


def clip_uris(count: int) -> list[str]:
    """``count`` distinct 5 s mono clips: a chirp over a tone, 16-bit WAV at 48 kHz."""
    from tests.fixtures.media_samples import CLAP_RATE, audio_data_uri, chirp, sine

    out = []
    for i in range(count):
        clip = chirp(100.0 + 40 * i, 6000.0 - 200 * i, CLIP_SECONDS, CLAP_RATE, 0.4)
        clip = clip + sine(220.0 * (1 + i % 5), CLIP_SECONDS, CLAP_RATE, 0.2)
        out.append(audio_data_uri(clip.astype(np.float32), CLAP_RATE))
    return out


def uri_bytes(uri: str) -> bytes:
    import base64

    return base64.b64decode(uri.split(",", 1)[1])


def reference_vectors(model: Path, modality: str, uris: Sequence[str]) -> np.ndarray:
    """transformers in fp32 on the decoded inputs, with the model directory's processor."""
    import torch
    from transformers import AutoModel, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model))
    net = AutoModel.from_pretrained(str(model), dtype=torch.float32).eval()
    with torch.inference_mode():
        if modality == "image":
            from PIL import Image

            images = [Image.open(io.BytesIO(uri_bytes(u))).convert("RGB") for u in uris]
            feats = processor.image_processor(images=images, return_tensors="pt")
            out = net.get_image_features(pixel_values=feats["pixel_values"])
        else:
            from tests.fixtures.media_samples import decode_clip

            rate = processor.feature_extractor.sampling_rate
            clips = [decode_clip(uri_bytes(u), rate) for u in uris]
            feats = processor.feature_extractor(clips, sampling_rate=rate, return_tensors="pt")
            out = net.get_audio_features(input_features=feats["input_features"])
    out = getattr(out, "pooler_output", out)
    return out.float().numpy()


def vision_flops_per_image(model: Path) -> float:
    """Model FLOPs of one image through the vision tower (benchmarks/flops.py's formula):
    2 * P_layers * L + 4 * layers * d * L^2 over L = patches + 1 tokens, plus the patch
    embedding (a multiply-add per weight per patch) and the projection."""
    from safetensors import safe_open

    vision = json.loads((model / "config.json").read_text())["vision_config"]
    d, layers = int(vision["hidden_size"]), int(vision["num_hidden_layers"])
    patches = (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
    tokens = patches + 1
    with safe_open(str(model / "model.safetensors"), "np") as f:

        def size(match: str) -> int:
            return sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys() if match in k)

        layer_params = size("vision_model.encoder.layers.")
        patch_params = size("vision_model.embeddings.patch_embedding.weight")
        projection = size("visual_projection.weight")
    return float(
        2 * layer_params * tokens
        + 4 * layers * d * tokens * tokens
        + 2 * patch_params * patches
        + 2 * projection
    )


def inprocess_ceiling(model: Path, seconds: float, batch: int = 8) -> dict[str, float]:
    """Images/s of ``get_image_features`` alone (preprocessed pixels, fp32, all cores), in
    this process with no server: what a server could approach on this host."""
    import torch
    from transformers import CLIPModel

    net = CLIPModel.from_pretrained(str(model), dtype=torch.float32).eval()
    old = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        pixels = torch.randn(batch, 3, 224, 224)
        with torch.inference_mode():
            net.get_image_features(pixel_values=pixels)
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                net.get_image_features(pixel_values=pixels)
                done += batch
            wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(old)
    return {"images_per_s": round(done / wall, 2), "batch": batch, "seconds": round(wall, 1)}


# --- requests ------------------------------------------------------------------------------


def body(server: harness.ServerDef, uris: Sequence[str], modality: str) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "input": list(uris),
        "modality": modality,
        "encoding_format": "float",
    }


def build_requests(
    server: harness.ServerDef, load: MediaLoad, pool: Sequence[str], part: int, parts: int
) -> list[loadgen.Request]:
    """Requests ``part`` of ``parts`` of ``load``; inputs cycle through ``pool``, each slice
    starting where the previous one stopped."""
    lo, hi = harness.slice_bounds(load.requests, parts, part)
    out = []
    for r in range(lo, hi):
        start = r * load.per_request
        chunk = [pool[(start + j) % len(pool)] for j in range(load.per_request)]
        out.append(
            loadgen.Request(
                server.embed_path, body(server, chunk, load.modality), load.per_request, 0, "embed"
            )
        )
    return out


async def fetch_vectors(
    base: str, server: harness.ServerDef, uris: Sequence[str], modality: str, per_request: int = 8
) -> np.ndarray:
    import httpx

    loadgen.check_loopback(base)
    rows: list[list[float]] = []
    async with httpx.AsyncClient(base_url=base, timeout=120.0, trust_env=False) as client:
        for i in range(0, len(uris), per_request):
            chunk = uris[i : i + per_request]
            resp = await client.post(server.embed_path, json=body(server, chunk, modality))
            resp.raise_for_status()
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            rows.extend(d["embedding"] for d in data)
    return np.asarray(rows, dtype=np.float64)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))


# --- session --------------------------------------------------------------------------------


def uptime_line() -> str:
    return f"load average {harness.loadavg()}"


def run_session(
    servers: Sequence[harness.ServerDef],
    model: Path,
    loads: Sequence[MediaLoad],
    pool: Sequence[str],
    reference: np.ndarray,
    cosine_uris: Sequence[str],
    slices: int,
    time_limit_s: float,
    start_timeout: float,
    tag: str,
) -> list[dict[str, Any]]:
    """Start each server, check its vectors, then run ``loads`` interleaved by slice."""
    fleet: list[harness.Live] = []
    modality = loads[0].modality
    try:
        for server in servers:
            print(
                f"[{tag}] starting {server.name} ... ({uptime_line()})", file=sys.stderr, flush=True
            )
            live = harness.start_server(server, model, tag, start_timeout)
            fleet.append(live)
            if not live.ok:
                print(f"    failed: {live.row.get('error')}", file=sys.stderr, flush=True)
                continue
            try:
                warm = [r for load in loads for r in build_requests(server, load, pool, 0, 8)[:2]]
                asyncio.run(
                    loadgen.run_load(
                        live.base_url, warm, name="warm", concurrency=1, request_timeout_s=300.0
                    )
                )
                got = asyncio.run(
                    fetch_vectors(
                        live.base_url, server, cosine_uris, modality, loads[0].per_request
                    )
                )
                cos = cosines(got, reference)
                live.row[f"cosine_{modality}_min"] = round(float(cos.min()), 6)
                live.row[f"cosine_{modality}_mean"] = round(float(cos.mean()), 6)
            except Exception as exc:
                harness.fail(live, exc)
        up = [x for x in fleet if x.ok]
        time.sleep(3.0)
        for x in up:
            assert x.proc is not None
            x.row["idle_rss_mib"] = round(harness.tree_rss_bytes(x.proc.pid) / 2**20, 1)
        parts: dict[tuple[str, str], list[loadgen.LoadResult]] = {}
        cpu_s: dict[tuple[str, str], float] = {}  # the server's process tree, over the load
        loadavgs: list[str] = []
        with harness.PeakRss([x.proc.pid for x in up if x.proc]) as peak:
            for k in range(slices):
                rotation = up[k % len(up) :] + up[: k % len(up)] if up else []
                for load in loads:
                    for x in rotation:
                        reqs = build_requests(x.server, load, pool, k, slices)
                        assert x.proc is not None
                        cpu0 = harness.tree_cpu_seconds(x.proc.pid)
                        res = asyncio.run(
                            loadgen.run_load(
                                x.base_url,
                                reqs,
                                name=load.name,
                                concurrency=load.concurrency,
                                time_limit_s=time_limit_s / slices,
                                request_timeout_s=300.0,
                            )
                        )
                        cpu = harness.tree_cpu_seconds(x.proc.pid) - cpu0
                        parts.setdefault((x.server.name, load.name), []).append(res)
                        cpu_s[(x.server.name, load.name)] = (
                            cpu_s.get((x.server.name, load.name), 0.0) + cpu
                        )
                        print(
                            f"    [{tag}] slice {k} {load.name} {x.server.name}: "
                            f"{res.items_per_s:.1f} items/s, "
                            f"{1000 * cpu / max(res.items, 1):.0f} CPU ms/item, "
                            f"{res.errors} errors "
                            f"({uptime_line()})",
                            file=sys.stderr,
                            flush=True,
                        )
                loadavgs.append(harness.loadavg())
        for x in up:
            assert x.proc is not None
            x.row[f"peak_rss_mib_{tag}"] = round(peak.peak[x.proc.pid] / 2**20, 1)
            x.row.setdefault("loads", {})
            for load in loads:
                slices_ = parts.get((x.server.name, load.name), [])
                if not slices_:
                    continue
                merged = loadgen.merge_results(slices_).summary()
                merged["slice_rates"] = [round(p.items_per_s, 2) for p in slices_]
                cpu = cpu_s.get((x.server.name, load.name), 0.0)
                if merged["items"]:
                    merged["cpu_ms_per_item"] = round(1000 * cpu / merged["items"], 1)
                    merged["cpu_cores"] = round(cpu / merged["wall_s"], 2)
                x.row["loads"][load.name] = merged
            x.row[f"loadavg_per_slice_{tag}"] = loadavgs
        for x in fleet:
            x.row[f"cold_start_s_{tag}"] = x.row.pop("cold_start_s", None)
            x.row[f"idle_rss_mib_{tag}"] = x.row.pop("idle_rss_mib", None)
        return [x.row for x in fleet]
    finally:
        for x in fleet:
            if x.proc is not None:
                harness.stop(x.proc)


def merge_rows(into: dict[str, dict[str, Any]], rows: Sequence[dict[str, Any]]) -> None:
    for row in rows:
        base = into.setdefault(row["server"], {"server": row["server"], "family": row["family"]})
        loads = {**base.get("loads", {}), **row.get("loads", {})}
        base.update(row)
        base["loads"] = loads


def add_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Rate ÷ Infinity's rate per load (>1: faster than Infinity), over the whole load and
    slice by slice: slice k of two servers ran back to back, so on a host whose other load
    comes and goes the paired ratios (their median and range) say more than the totals."""
    inf = [r for r in rows if r["family"] == "infinity"]
    for r in rows:
        vs: dict[str, float] = {}
        paired: dict[str, list[float]] = {}
        for name in LOADS:
            mine = r.get("loads", {}).get(name, {})
            theirs = [x["loads"][name] for x in inf if name in x.get("loads", {})]
            if not (mine.get("ok") and theirs and theirs[0].get("items_per_s")):
                continue
            vs[name] = round(mine["items_per_s"] / theirs[0]["items_per_s"], 2)
            pairs = zip(mine.get("slice_rates", []), theirs[0].get("slice_rates", []), strict=False)
            paired[name] = [round(a / b, 2) for a, b in pairs if b > 0]
        r["vs_infinity"] = vs
        r["vs_infinity_per_slice"] = paired


def _cpu(load: dict[str, Any] | None) -> str:
    if not load or "cpu_ms_per_item" not in load:
        return "–"
    return f"{load['cpu_ms_per_item']:.0f} ({load['cpu_cores']:.2f})"


def _paired(ratios: Sequence[float] | None) -> str:
    if not ratios:
        return "–"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


# --- report ---------------------------------------------------------------------------------


def _rate(load: dict[str, Any] | None) -> str:
    if not load:
        return "–"
    rates = load.get("slice_rates") or []
    spread = ""
    if len(rates) > 1:
        spread = f" ({min(rates):.1f}–{max(rates):.1f}; med {statistics.median(rates):.1f})"
    star = "*" if load.get("timed_out") else ""
    return f"{load['items_per_s']:.1f}{star}{spread}"


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    fc = m["foreign_cpu"]
    out = [
        f"# Images and audio: Ember vs Infinity on CPU — {m['date']}",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB RAM, no GPU; load "
        f"average at start / end: {m['loadavg_start']} / {m['loadavg_end']}; other processes "
        f"used {fc['mean_cores']} cores on average (max {fc['max_cores']}) during the run"
        + (" — a noisy run: compare rows, not runs." if fc["mean_cores"] > 0.2 else "."),
        f"- torch fp32 GEMM peak, {m['threads']} threads: {m['gemm_peak_gflops']:.0f} GFLOP/s "
        f"(start {m['gemm_start_gflops']:.0f}, end {m['gemm_end_gflops']:.0f}).",
        "- Models (seeded random weights, real configs; fp32 unless the server name says "
        "bfloat16; both servers load the same "
        "directory offline): CLIP with openai/clip-vit-base-patch32's config "
        f"({m['clip_gflops_per_image']:.2f} model GFLOP per 224×224 image through the vision "
        "tower); CLAP with laion/clap-htsat-unfused's config.",
        f"- In-process ceiling (no server, `get_image_features` on preprocessed batches of "
        f"{m['ceiling']['batch']}, fp32, {m['threads']} threads, this run): "
        f"{m['ceiling']['images_per_s']:.1f} images/s.",
        f"- Versions: {m['versions']}",
        f"- Command: `{m['command']}` ({m['total_s']:.0f} s)",
        "",
        "| server | cold start s CLIP / CLAP | idle RSS MiB CLIP / CLAP | (i8) b8×c4 img/s | "
        "(i1) b1×c16 img/s | (a3) CLAP b3×c2 clips/s | errors | worst cos image / audio | "
        "server CPU ms/item (cores busy) i8 / i1 / a3 | ×Infinity i8 / i1 / a3 | "
        "×Infinity per slice, median (range): i8 / i1 / a3 | GEMM frac (i8) |",
        "|" + "---|" * 12,
    ]
    for r in result["rows"]:
        L = r.get("loads", {})
        errs = sum(x.get("errors", 0) for x in L.values())
        vs = r.get("vs_infinity", {})
        frac = r.get("gemm_fraction_i8")
        failed = "; ".join(str(r.get(k))[:90] for k in ("error_log", "error") if r.get(k)).replace(
            "|", "/"
        )
        out.append(
            "| "
            + " | ".join(
                [
                    r["server"] + (f" (failed: {failed})" if failed else ""),
                    " / ".join(
                        harness._fmt(r.get(f"cold_start_s_{t}"), 1) for t in ("clip", "clap")
                    ),
                    " / ".join(
                        harness._fmt(r.get(f"idle_rss_mib_{t}"), 0) for t in ("clip", "clap")
                    ),
                    _rate(L.get("i8")),
                    _rate(L.get("i1")),
                    _rate(L.get("a3")),
                    str(errs),
                    " / ".join(
                        harness._fmt(r.get(f"cosine_{t}_min"), 6) for t in ("image", "audio")
                    ),
                    " / ".join(_cpu(L.get(k)) for k in LOADS),
                    " / ".join(harness._fmt(vs.get(k), 2) for k in LOADS),
                    " / ".join(_paired(r.get("vs_infinity_per_slice", {}).get(k)) for k in LOADS),
                    harness._fmt(frac, 3),
                ]
            )
            + " |"
        )
    out += [
        "",
        "- Loads: "
        + "; ".join(f"({x.name}) {x.description}, {x.requests} requests" for x in LOADS.values())
        + f", per server. Each load is cut into {m['slices']} slices and the servers take "
        "turns slice by slice (the first server rotates); at most "
        f"{m['time_limit_s']:.0f} s per load and server (* = cut short: the rate covers what "
        "ran). Rates: items of successful requests over the measured wall time, all slices; "
        "in brackets the lowest–highest slice rate and their median. Warm-up and the cosine "
        "requests are not timed.",
        f"- Images: {IMAGE_POOL} distinct 224×224 JPEG data URIs "
        "(`tests.fixtures.media_samples.benchmark_jpeg_uris`), cycled. Clips: "
        f"{CLIP_POOL} distinct 5 s chirp-plus-tone mono WAVs, 16 bit, 48 kHz (CLAP's rate, so "
        "no resampling; shorter than CLAP's 10 s window, so repeat-padded, no random crop).",
        f"- worst cos: the worst of {COSINE_IMAGES} images / {COSINE_CLIPS} clips against "
        "transformers' get_image_features / get_audio_features in fp32 on the same decoded "
        "inputs, in Ember's venv (transformers "
        f"{m['transformers']}).",
        "- ×Infinity: the rate ÷ Infinity's over all slices; per slice: slice k of both "
        "servers ran back to back, so the median and range of those ratios are the "
        "comparison least moved by other work on the host. GEMM frac: model FLOPs/s in "
        "(i8) ÷ the GEMM peak. CPU ms/item: user+system CPU time of the server's process "
        "tree over the load ÷ items served, and in brackets that time ÷ wall time (cores the "
        "server kept busy): what an item costs each server, which other work on the host "
        "moves far less than it moves rates.",
        "- The load generator shares the same cores with the server under test, for every "
        "server alike. Load average after each slice: "
        + "; ".join(f"{t}: {', '.join(v)}" for t, v in m["loadavg_per_slice"].items())
        + ".",
    ]
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Ember vs Infinity, images and audio (CPU).")
    p.add_argument("--ember", default="torch:float32", help="comma list of backend:dtype")
    p.add_argument("--infinity-engines", default="torch", help="comma list ('' for none)")
    p.add_argument("--infinity-venv", type=Path, default=REPO / "benchmarks" / ".venv-infinity")
    p.add_argument("--models", default="clip,clap", help="subset of clip,clap")
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every load's requests")
    p.add_argument(
        "--time-limit",
        type=float,
        default=120.0,
        help="seconds per load and server at most (split over the slices)",
    )
    p.add_argument("--ceiling-seconds", type=float, default=10.0)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    global LOADS
    args = parse_args(argv)
    if args.quick:
        args.scale, args.slices, args.ceiling_seconds = 0.1, 2, 2.0
    LOADS = {
        k: MediaLoad(
            v.name,
            v.modality,
            v.per_request,
            v.concurrency,
            max(args.slices, round(v.requests * args.scale)),
            v.description,
        )
        for k, v in LOADS.items()
    }
    waited = harness.wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
    t_start = time.perf_counter()
    load_start = harness.loadavg()
    foreign = harness.ForeignCpu().start()
    threads = os.cpu_count() or 1
    models = build_models()
    wanted = [m for m in args.models.split(",") if m]
    gemm_start = harness.matmul_peak_gflops(threads)
    ceiling = inprocess_ceiling(models["clip"], args.ceiling_seconds)
    servers = [harness.ember_server(s, sys.executable) for s in args.ember.split(",") if s] + [
        harness.infinity_server(e, args.infinity_venv)
        for e in args.infinity_engines.split(",")
        if e
    ]
    rows: dict[str, dict[str, Any]] = {}
    loadavg_slices: dict[str, list[str]] = {}
    # per model kind: its input pool (built only when wanted), inputs compared by cosine,
    # the modality it embeds, and its loads
    sessions = {
        "clip": (lambda: image_uris(IMAGE_POOL), COSINE_IMAGES, "image", ("i8", "i1")),
        "clap": (lambda: clip_uris(CLIP_POOL), COSINE_CLIPS, "audio", ("a3",)),
    }
    for kind, (make_pool, cosines, modality, loads) in sessions.items():
        if kind not in wanted:
            continue
        pool = make_pool()
        sample = pool[:cosines]
        ref = reference_vectors(models[kind], modality, sample)
        got = run_session(
            servers,
            models[kind],
            [LOADS[name] for name in loads],
            pool,
            ref,
            sample,
            args.slices,
            args.time_limit,
            args.start_timeout,
            kind,
        )
        merge_rows(rows, got)
        key = f"loadavg_per_slice_{kind}"
        loadavg_slices[kind] = next((r[key] for r in got if key in r), [])
    gemm_end = harness.matmul_peak_gflops(threads)
    foreign_cpu = foreign.stop()
    peak = max(gemm_start, gemm_end)
    flops_image = vision_flops_per_image(models["clip"])
    table = list(rows.values())
    add_ratios(table)
    for r in table:
        i8 = r.get("loads", {}).get("i8", {})
        if i8.get("ok"):
            r["gemm_fraction_i8"] = round(i8["items_per_s"] * flops_image / 1e9 / peak, 3)
    from importlib.metadata import version

    date = dt.date.today().isoformat()
    mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    result = {
        "meta": {
            "date": date,
            "cpu": harness.cpu_name(),
            "cores": os.cpu_count(),
            "mem_gib": mem_gib,
            "threads": threads,
            "gemm_peak_gflops": round(peak, 1),
            "gemm_start_gflops": round(gemm_start, 1),
            "gemm_end_gflops": round(gemm_end, 1),
            "loadavg_start": load_start,
            "loadavg_end": harness.loadavg(),
            "loadavg_per_slice": loadavg_slices,
            "foreign_cpu": foreign_cpu,
            "waited_for_quiet_s": round(waited, 1),
            "ceiling": ceiling,
            "clip_gflops_per_image": round(flops_image / 1e9, 3),
            "versions": harness.versions([s.venv for s in servers if s.venv is not None]),
            "transformers": version("transformers"),
            "models": {k: str(v) for k, v in models.items()},
            "loads": {k: vars(v) for k, v in LOADS.items()},
            "slices": args.slices,
            "time_limit_s": args.time_limit,
            "command": " ".join(["benchmarks/media.py", *(argv or sys.argv[1:])]),
            "total_s": round(time.perf_counter() - t_start, 1),
        },
        "rows": table,
    }
    text = markdown(result)
    print(text)
    out = args.out or RESULTS / f"{date}-media{'-quick' if args.quick else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
