"""`ember serve` / `ember export`: flags generated from ServerSettings, so flag, env var
and default cannot disagree (and the README's flag table is generated the same way)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ember import __version__
from ember.backends.registry import EXPORTERS
from ember.config import PER_MODEL_FIELDS, ServerSettings, env_var
from ember.errors import ConfigError, EmberError
from ember.jobs.command import add_embed_parser, run_embed

SERVE_HELP = "Serve models over HTTP (OpenAI, Cohere and TEI routes)."
EXPORT_HELP = f"Convert a model for a backend ahead of time ({', '.join(EXPORTERS)})."
# The settings `ember export` takes: flags, env vars, defaults and checks are serve's.
EXPORT_FIELDS = (
    "model_id",
    "revision",
    "task",
    "backend",
    "dtype",
    "pooling",
    "trust_remote_code",
    "neuron_batch_size",
    "neuron_sequence_lengths",
    "neuron_auto_cast",
    "neuron_cores",
)
# Export's flags before they were settings, still accepted.
EXPORT_ALIASES = {
    "neuron_batch_size": ("--batch-size",),
    "neuron_sequence_lengths": ("--sequence-lengths",),
    "neuron_cores": ("--num-cores",),
}


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


def add_settings_arguments(
    parser: argparse.ArgumentParser,
    names: Iterable[str] | None = None,
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
    help_overrides: Mapping[str, str] | None = None,
) -> None:
    """One flag per setting (``names``: these only), its help the setting's description."""
    for name in names or ServerSettings.model_fields:
        field = ServerSettings.model_fields[name]
        description = (help_overrides or {}).get(name, field.description)
        help_text = f"{description} [env {env_var(name)}]".replace("%", "%%")  # argparse
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if name in PER_MODEL_FIELDS:
            kwargs.update(action="append", metavar="VALUE")
        elif field.annotation is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        elif field.annotation in (int, int | None):
            kwargs.update(type=int, metavar="INT")
        elif field.annotation is float:
            kwargs.update(type=float, metavar="SECONDS")
        else:
            kwargs.update(metavar="VALUE")
        flags = [_flag(name), *(aliases or {}).get(name, ())]
        parser.add_argument(*flags, **kwargs)


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
    export.add_argument("--output", required=True, help="Directory to write.")
    add_settings_arguments(
        export,
        EXPORT_FIELDS,
        aliases=EXPORT_ALIASES,
        help_overrides={
            "model_id": "Hugging Face hub id or local directory of the one model to convert; "
            "default: the packaged model.",
            "backend": f"{'|'.join(EXPORTERS)}: the backend to convert for.",
            "dtype": "onnx: auto|float32|int8; ct2: auto|float32|int8|bfloat16.",
        },
    )
    add_embed_parser(sub, add_settings_arguments)
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """CLI values win over EMBER_* env vars, which win over defaults."""
    from ember.config import settings_from_env

    values = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields}
    return settings_from_env(**values)


def _server_class() -> type:
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises a SIGTERM it handled once it has shut down gracefully, so the
        process ends killed by it (exit 143); an orderly stop on SIGTERM exits 0 here."""

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            captured = getattr(self, "_captured_signals", None)
            if sig == signal.SIGTERM and isinstance(captured, list) and sig in captured:
                captured.remove(sig)

    return Server


def serve(settings: ServerSettings) -> int:
    import uvicorn

    _Server = _server_class()

    from ember.api.app import create_app
    from ember.api.connections import KEEP_ALIVE_TIMEOUT, ConnectionLimits, http_protocol
    from ember.logs import configure_logging

    configure_logging(settings.log_level, settings.json_logs)
    limits = ConnectionLimits(
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        max_connections=settings.max_connections,
    )
    failed: list[BaseException] = []
    config = uvicorn.Config(
        "ember.api.app:create_app",  # placeholder, replaced below with the built app
        host=settings.host,
        port=settings.port,
        http=http_protocol(limits),
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
        log_config=None,
        access_log=settings.log_level == "debug",  # per-request lines cost throughput
        timeout_graceful_shutdown=10,
    )
    server = _Server(config)

    def stop(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    config.app = create_app(settings, on_load_failure=stop)
    server.run()
    return 1 if failed else 0


def export(settings: ServerSettings, output: str) -> int:
    """Convert the one configured model for its backend into ``output``."""
    from dataclasses import replace
    from pathlib import Path

    from tqdm import tqdm

    from ember.backends.registry import exporter_module
    from ember.models.resolve import resolve_model

    module = exporter_module((settings.backend or "").strip().lower())
    specs = settings.model_specs()  # the checks serve makes
    if len(specs) != 1:
        raise ConfigError(f"ember export converts one model, got {len(specs)} (--model-id)")
    spec = replace(specs[0], device="cpu")
    model = resolve_model(spec)
    assert model.kind is not None
    if not model.kind.exportable:
        raise ConfigError(
            f"ember export writes dense, rerank and classify models; {model.served_name} is a "
            f"{model.kind.name} model, whose heads live beside the network: serve its own "
            "directory (the backend's artifact is built at first load and kept in --cache-dir)"
        )
    with tqdm(desc=f"export {spec.backend}", unit="step") as bar:

        def progress(step: str) -> None:
            bar.set_postfix_str(step)
            bar.update(1)

        written = module.export(model, Path(output), progress=progress)
    print(f"wrote {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(settings_from_args(args))
        if args.command == "embed":
            return run_embed(args, settings_from_args(args))
        return export(settings_from_args(args), args.output)
    except EmberError as exc:
        print(f"ember: error: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
