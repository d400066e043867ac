"""`ember serve` / `ember export`: flags generated from ServerSettings, so flag, env var
and default cannot disagree (and the README's flag table is generated the same way)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ember import __version__
from ember.config import PER_MODEL_FIELDS, ServerSettings, env_var
from ember.errors import EmberError

SERVE_HELP = "Serve models over HTTP (OpenAI, Cohere and TEI routes)."
EXPORT_HELP = "Convert a model for a backend ahead of time (onnx, ct2, neuron)."


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default_text(name: str) -> str:
    field = ServerSettings.model_fields[name]
    default = field.default
    return (
        ""
        if default is None
        else str(default).lower()
        if isinstance(default, bool)
        else str(default)
    )


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    for name, field in ServerSettings.model_fields.items():
        help_text = f"{field.description} [env {env_var(name)}]".replace("%", "%%")  # argparse
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if name in PER_MODEL_FIELDS:
            kwargs.update(action="append", metavar="VALUE")
        elif field.annotation is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        elif field.annotation is int:
            kwargs.update(type=int, metavar="INT")
        elif field.annotation is float:
            kwargs.update(type=float, metavar="SECONDS")
        else:
            kwargs.update(metavar="VALUE")
        parser.add_argument(_flag(name), **kwargs)


def flag_table() -> str:
    """The README's flag table, generated: a test keeps the README equal to it."""
    rows = ["| flag | env var | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in ServerSettings.model_fields.items():
        per_model = " (per model)" if name in PER_MODEL_FIELDS else ""
        default = _default_text(name)
        rows.append(
            f"| `{_flag(name)}` | `{env_var(name)}` | {f'`{default}`' if default else ''} | "
            f"{(field.description or '').replace('|', chr(92) + '|')}{per_model} |"
        )
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Ember: serve retrieval models.")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help=SERVE_HELP, description=SERVE_HELP)
    add_settings_arguments(serve)
    export = sub.add_parser("export", help=EXPORT_HELP, description=EXPORT_HELP)
    export.add_argument("--model-id", default=None, help="Hub id or local dir (default model).")
    export.add_argument("--backend", required=True, choices=("onnx", "ct2", "neuron"))
    export.add_argument("--output", required=True, help="Directory to write.")
    export.add_argument(
        "--dtype", default="auto", help="onnx: auto|float32|int8; ct2: auto|float32|int8|bfloat16."
    )
    export.add_argument("--task", default="auto", help="auto|embed|rerank|classify")
    export.add_argument("--pooling", default="auto", help="auto|cls|mean|last|max")
    export.add_argument("--batch-size", type=int, default=1, help="neuron: compiled batch size.")
    export.add_argument(
        "--sequence-lengths",
        default="128,256,512",
        help="neuron: comma-separated compiled sequence buckets.",
    )
    export.add_argument("--num-cores", type=int, default=None, help="neuron: NeuronCores.")
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """CLI values win over EMBER_* env vars, which win over defaults."""
    from ember.config import settings_from_env

    values = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields}
    return settings_from_env(**values)


def serve(settings: ServerSettings) -> int:
    import uvicorn

    from ember.api.app import create_app
    from ember.logs import configure_logging

    configure_logging(settings.log_level, settings.json_logs)
    failed: list[BaseException] = []
    config = uvicorn.Config(
        "ember.api.app:create_app",  # placeholder, replaced below with the built app
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=settings.log_level == "debug",  # per-request lines cost throughput
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)

    def stop(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    config.app = create_app(settings, on_load_failure=stop)
    server.run()
    return 1 if failed else 0


def export(args: argparse.Namespace) -> int:
    import importlib
    from pathlib import Path

    from ember.models.resolve import resolve_model
    from ember.models.spec import ModelSpec

    spec = ModelSpec(
        model_id=args.model_id or "",
        task=None if args.task == "auto" else args.task,
        pooling=None if args.pooling == "auto" else args.pooling,
        backend=args.backend,
        dtype=args.dtype,
        device="cpu",
    )
    model = resolve_model(spec)
    module = importlib.import_module(f"ember.backends.{args.backend}_backend")
    out = Path(args.output)
    from tqdm import tqdm

    with tqdm(desc=f"export {args.backend}", unit="step") as bar:

        def progress(step: str) -> None:
            bar.set_postfix_str(step)
            bar.update(1)

        extra: dict[str, Any] = {}
        if args.backend == "neuron":
            extra = {
                "batch_size": args.batch_size,
                "sequence_lengths": [int(x) for x in args.sequence_lengths.split(",") if x],
                "num_cores": args.num_cores,
            }
        written = module.export(model, out, progress=progress, **extra)
    print(f"wrote {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(settings_from_args(args))
        return export(args)
    except EmberError as exc:
        print(f"ember: error: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
