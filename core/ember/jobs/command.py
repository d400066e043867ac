"""`ember embed INPUT --output DIR`: the corpus job's flags and entry point.

The model flags are serve's own (generated from ``ServerSettings``, same env vars and
defaults), so a job computes exactly what the server would; the job's flags are here.
Heavy imports (engines, pyarrow) wait until the command runs, so ``ember --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

EMBED_HELP = (
    "Embed a corpus (JSON Lines, CSV, Parquet or text) into a Parquet dataset, in-process, "
    "resumably: run it again after a stop and it continues where it was."
)
# The serve settings the job takes: which model, on what, batched how.
EMBED_FIELDS = (
    "model_id",
    "served_model_name",  # the `model` a batch file's answers name
    "revision",
    "backend",
    "device",
    "dtype",
    "pooling",
    "max_batch_tokens",
    "max_batch_size",
    "forward_workers",
    "torch_compile",
    "trust_remote_code",
    "accept_token_ids",  # token ids in a batch file's bodies, as the server takes them
    "cache_dir",
    "log_level",
    "otlp_endpoint",
)


def add_embed_parser(sub: Any, add_settings_arguments: Callable[..., None]) -> None:
    """Register ``embed`` on the CLI's subparsers."""
    from ember.jobs.inputs import BATCH_FORMAT, FORMATS
    from ember.jobs.runner import CHUNK_ROWS, IN_FLIGHT, SHARD_ROWS

    embed = sub.add_parser("embed", help=EMBED_HELP, description=EMBED_HELP)
    embed.add_argument("input", help="The corpus file.")
    embed.add_argument(
        "--output",
        required=True,
        help="Directory of the Parquet dataset (created; resumed); for an OpenAI batch file, "
        "the results JSON Lines file.",
    )
    embed.add_argument(
        "--input-format",
        choices=(*FORMATS, BATCH_FORMAT),
        default=None,
        help="Default: from the suffix; a .jsonl file whose first line has `custom_id` and "
        f"`body` is an OpenAI batch file ({BATCH_FORMAT}).",
    )
    embed.add_argument(
        "--text-column", default="text", help="Column (or JSON field) with the text [text]."
    )
    embed.add_argument(
        "--id-column",
        default=None,
        help="Column whose values pass through as `id`; default: the row's 0-based position.",
    )
    embed.add_argument(
        "--output-kind",
        choices=("dense", "sparse", "multi"),
        default=None,
        help="Which embedding to write; default: the model's own (the first it has).",
    )
    embed.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalise dense vectors; default: as the model says.",
    )
    embed.add_argument(
        "--dimensions", type=int, default=None, help="Matryoshka: keep the first N dimensions."
    )
    embed.add_argument("--prompt-name", default=None, help="One of the model's prompts.")
    embed.add_argument(
        "--shard-rows",
        type=int,
        default=None,
        help=f"Input rows per Parquet shard, the checkpoint unit (with --chunk-tokens, all "
        f"their chunks) [{SHARD_ROWS}; with --ray: sized so every worker gets several shards, "
        "at most that].",
    )
    embed.add_argument(
        "--in-flight",
        type=int,
        default=IN_FLIGHT,
        help=f"Inputs (with --chunk-tokens, chunks) queued ahead for the batcher [{IN_FLIGHT}]; "
        "ct2 on CPU ran faster with 128 (smaller batches).",
    )
    embed.add_argument(
        "--chunk-rows", type=int, default=CHUNK_ROWS, help=f"Inputs per engine call [{CHUNK_ROWS}]."
    )
    embed.add_argument(
        "--overwrite", action="store_true", help="Discard what the output directory holds."
    )
    embed.add_argument(
        "--truncate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Cut texts past the model's maximum length; with --no-truncate such a row is "
        "refused: left out of the dataset and written to DIR/_errors.jsonl (id, position, "
        "error), and counted in the summary's `errors`.",
    )
    _add_chunk_arguments(embed)
    embed.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="Embed the shards on a Ray cluster (pip install 'ember[ray]'): the cluster at "
        "ADDRESS (or RAY_ADDRESS), else a local one sized to this machine, started and "
        "stopped by the job. Same output as in-process; either resumes the other's. "
        "Put it after INPUT, or write --ray=ADDRESS.",
    )
    embed.add_argument(
        "--ray-workers",
        type=int,
        default=None,
        help="Ray actors, each with the model loaded once; default: as many as the "
        "cluster's CPUs (or GPUs, with --ray-gpus-per-worker) hold.",
    )
    embed.add_argument(
        "--ray-cpus-per-worker", type=float, default=1.0, help="CPUs each Ray worker takes [1]."
    )
    embed.add_argument(
        "--ray-gpus-per-worker",
        type=float,
        default=0.0,
        help="GPUs each Ray worker takes [0]; a fraction shares one GPU (0.5: two workers "
        "on each).",
    )
    embed.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Progress bar with rate and ETA on stderr.",
    )
    add_settings_arguments(
        embed,
        EMBED_FIELDS,
        help_overrides={
            "model_id": "Hugging Face hub id or local directory of the one model to run; "
            "default: the packaged model."
        },
    )


# The long-document flags (``ember.chunking``; their defaults are None so that a flag given
# without --chunk-tokens can be named).
CHUNK_FLAGS = ("overlap", "chunk_boundary", "late_chunking", "aggregate", "chunk_text")


def _add_chunk_arguments(embed: argparse.ArgumentParser) -> None:
    from ember.chunking import AGGREGATES, BOUNDARIES

    embed.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        metavar="N",
        help="Cut each text into chunks of at most N tokens and write one row per chunk: "
        "id, chunk (its 0-based index), char_start, char_end (code points: "
        "text[char_start:char_end] is the chunk), embedding. Texts past the model's length "
        "are then kept whole, not cut. Default: off, one row per text.",
    )
    embed.add_argument(
        "--overlap",
        type=int,
        default=None,
        metavar="M",
        help="Tokens each chunk repeats of the one before [0].",
    )
    embed.add_argument(
        "--chunk-boundary",
        choices=BOUNDARIES,
        default=None,
        help="Cut between words (token) or, where a sentence ends within the chunk, there "
        "(sentence) [token].",
    )
    embed.add_argument(
        "--late-chunking",
        action="store_true",
        default=None,
        help="One forward over each whole text (overlapping windows past the model's "
        "length), each chunk pooled from its own tokens; chunks may then be longer than the "
        "model's length. Mean or max pooling models only.",
    )
    embed.add_argument(
        "--aggregate",
        choices=AGGREGATES,
        default=None,
        help="Also write each text's own row, before its chunks, with chunk null and this "
        "aggregate of its chunks as embedding (mean: weighted by their tokens) [none].",
    )
    embed.add_argument(
        "--chunk-text",
        action="store_true",
        default=None,
        help="Write each chunk's text too (a `text` column; null on a text's own row).",
    )


def chunking_of_args(args: argparse.Namespace) -> Any:
    """The ``Chunking`` the chunk flags ask for (None: none): a chunk flag without
    --chunk-tokens is refused, naming it."""
    from ember.chunking import Chunking
    from ember.errors import ConfigError

    given = [f"--{n.replace('_', '-')}" for n in CHUNK_FLAGS if getattr(args, n) is not None]
    if args.chunk_tokens is None:
        if given:
            raise ConfigError(f"{given[0]} is for chunks: pass --chunk-tokens N too")
        return None
    return Chunking(
        size=args.chunk_tokens,
        overlap=args.overlap or 0,
        boundary=args.chunk_boundary or "token",
        late=bool(args.late_chunking),
        aggregate=args.aggregate or "none",
        text=bool(args.chunk_text),
    )


def run_embed(args: argparse.Namespace, settings: Any) -> int:
    """Run the job; the summary goes to stdout as one JSON line."""
    from pathlib import Path

    import orjson

    from ember import tracing
    from ember.config import otlp_export
    from ember.errors import ConfigError
    from ember.jobs.inputs import InputSpec
    from ember.jobs.runner import JobOptions, embed_corpus
    from ember.jobs.store import is_uri
    from ember.logs import configure_logging

    configure_logging(settings.log_level, settings.json_logs)
    tracing.configure(otlp_export(settings))  # a span per chunk of rows, or per batch line
    for name in ("shard_rows", "in_flight", "chunk_rows"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if args.ray_workers is not None and args.ray_workers < 1:
        raise ConfigError("--ray-workers must be at least 1")
    _check_worker_size(args.ray_cpus_per_worker, args.ray_gpus_per_worker)
    from ember.jobs.batch import is_batch_file

    chunking = chunking_of_args(args)
    if is_batch_file(Path(args.input), args.input_format):
        if chunking is not None:
            raise ConfigError(
                "--chunk-tokens is for a corpus; a batch file's lines say it in each body "
                "(chunking, late_chunking)"
            )
        if args.ray is not None:
            raise ConfigError("--ray runs a corpus; a batch file runs in-process")
        return _run_batch(args, settings)
    source = InputSpec.of(
        args.input,
        format=args.input_format,
        text_column=args.text_column,
        id_column=args.id_column,
    )
    options = JobOptions(
        output=args.output if is_uri(args.output) else Path(args.output),
        output_kind=args.output_kind,
        normalize=args.normalize,
        dimensions=args.dimensions,
        prompt_name=args.prompt_name,
        shard_rows=args.shard_rows,
        in_flight=args.in_flight,
        chunk_rows=args.chunk_rows,
        overwrite=args.overwrite,
        progress=args.progress,
        truncate=args.truncate,
        chunking=chunking,
    )
    if args.ray is None:
        summary = embed_corpus(settings, source, options)
    else:
        summary = _run_ray(args, settings, source, options)
    sys.stdout.write(orjson.dumps(summary.line()).decode() + "\n")
    return 0


def _check_worker_size(cpus: float, gpus: float) -> None:
    """What Ray would refuse later, or wait on forever, refused in one line now: a GPU
    share is a fraction of one GPU or whole GPUs (0.5 puts two workers on each)."""
    from ember.errors import ConfigError

    if cpus < 0 or gpus < 0:
        raise ConfigError("--ray-cpus-per-worker and --ray-gpus-per-worker cannot be negative")
    if cpus == 0 and gpus == 0:
        raise ConfigError("a Ray worker needs CPUs or GPUs: --ray-cpus-per-worker is 0")
    if gpus > 1 and gpus != int(gpus):
        raise ConfigError(
            f"--ray-gpus-per-worker {gpus:g}: more than one GPU must be a whole number "
            "(a fraction of one GPU shares it: 0.5 puts two workers on each)"
        )


def _run_ray(args: argparse.Namespace, settings: Any, source: Any, options: Any) -> Any:
    """The job on Ray (``ember.ray.job``); Ray imported only here."""
    from ember.errors import ConfigError

    try:
        from ember.ray.job import RayOptions, embed_on_ray
    except ImportError as exc:  # the extra is missing: one line, naming it
        raise ConfigError(str(exc)) from None
    on = RayOptions(
        address=args.ray or None,
        workers=args.ray_workers,
        cpus_per_worker=args.ray_cpus_per_worker,
        gpus_per_worker=args.ray_gpus_per_worker,
    )
    return embed_on_ray(settings, source, options, on)


# Corpus flags that a batch file's lines carry in their own bodies instead.
BATCH_REFUSED = ("id_column", "output_kind", "normalize", "dimensions", "prompt_name")
# (--no-truncate too: a batch line's body says truncate itself)


def _run_batch(args: argparse.Namespace, settings: Any) -> int:
    """An OpenAI batch file: one result line per input line (``ember.jobs.batch``)."""
    from pathlib import Path

    import orjson

    from ember.errors import ConfigError
    from ember.jobs.batch import run_batch_file
    from ember.jobs.runner import SHARD_ROWS

    given = [n for n in BATCH_REFUSED if getattr(args, n) is not None]
    given += [] if args.truncate else ["truncate"]
    if given or args.text_column != "text":
        name = (given or ["text_column"])[0].replace("_", "-")
        raise ConfigError(f"--{name} is for a corpus; a batch file's lines say it in each body")
    summary = run_batch_file(
        settings,
        Path(args.input),
        Path(args.output),
        in_flight=args.in_flight,
        commit_lines=args.shard_rows or SHARD_ROWS,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    line = {
        "output": str(summary.output),
        "requests": summary.requests,
        "requests_this_run": summary.requests_this_run,
        "errors": summary.errors,
        "resumed_from": summary.resumed_from,
        "seconds": round(summary.seconds, 3),
    }
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    return 0
