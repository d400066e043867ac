"""`ember serve` / `ember export`: flags generated from ServerSettings, so flag, env var
and default cannot disagree (and the docs' flag table, docs/reference/cli.md, is generated
the same way)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ember import __version__
from ember.backends.registry import EXPORTERS
from ember.config import PER_MODEL_FIELDS, ServerSettings, env_var
from ember.config_values import flag
from ember.errors import ConfigError, EmberError
from ember.infinity_options import infinity_cli_options
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


# What a setting's value counts, where its type alone does not say (a float is seconds
# unless named here; an int a count).
UNITS = {
    "port": "PORT",
    "max_image_aspect": "RATIO",
    "min_body_rate": "BYTES/S",
    "payload_limit": "BYTES",
    "max_batch_tokens": "TOKENS",
    "max_queue_size": "INPUTS",
    "max_batch_size": "INPUTS",
    "max_client_batch_size": "INPUTS",
    "max_image_side": "PIXELS",
    "forward_nice": "NICE",
    "idle_unload": "SECONDS",
}


def unit_of(name: str, fallback: str) -> str:
    """The metavar --help shows for a setting: its unit where it has one."""
    if name in UNITS:
        return UNITS[name]
    if name.endswith("_bytes"):
        return "BYTES"
    if name.endswith("_pixels"):
        return "PIXELS"
    return fallback


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
        default = _default_text(name)
        where = f"default {default}; env {env_var(name)}" if default else f"env {env_var(name)}"
        help_text = f"{description} [{where}]".replace("%", "%%")  # argparse
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if name in PER_MODEL_FIELDS:
            kwargs.update(action="append", metavar=unit_of(name, "VALUE"))
        elif field.annotation is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
        elif field.annotation in (int, int | None):
            kwargs.update(type=int, metavar=unit_of(name, "N"))
        elif field.annotation is float:
            kwargs.update(type=float, metavar=unit_of(name, "SECONDS"))
        else:
            kwargs.update(metavar=unit_of(name, "VALUE"))
        flags = [flag(name), *(aliases or {}).get(name, ())]
        parser.add_argument(*flags, **kwargs)


INFINITY_DEST = "infinity_"  # argparse dests of Infinity's own flags


def add_infinity_arguments(parser: argparse.ArgumentParser) -> None:
    """Infinity v2's flags that Ember names otherwise, or has no equivalent for."""
    group = parser.add_argument_group(
        "Infinity v2 flags",
        "Accepted so that an `infinity_emb v2` command line serves unchanged (`ember v2 ...` "
        "works too); each sets the Ember setting named, or warns once what Ember does "
        "instead. See docs/migrating-from-infinity.md.",
    )
    for option in infinity_cli_options():
        kwargs: dict[str, Any] = {"dest": INFINITY_DEST + option.name, "default": argparse.SUPPRESS}
        if option.switch:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(metavar="VALUE", action="append" if option.many else "store")
        if option.setting is None:
            quiet = ""
            if option.honoured is not None and option.switch:
                done = flag(option.name) if option.honoured == "true" else "--no-" + option.name
                quiet = f" ({done.replace('_', '-')} is what Ember does)"
            elif option.honoured is not None:
                quiet = f" ({option.honoured or 'empty'} is what Ember does)"
            text = f"Accepted, warns{quiet}: {option.note}."
        else:
            text = f"As {option.note}." if option.note.startswith("--") else f"{option.note}."
        group.add_argument(flag(option.name), help=text.replace("%", "%%"), **kwargs)


TEI_DEST = "tei_"  # argparse dests of text-embeddings-router's flags
TEI_HELP = (
    "Serve as text-embeddings-router would: its flags and variables (MODEL_ID, PORT, "
    "MAX_BATCH_TOKENS, ...), its default port 3000, and TEI's routes beside Ember's."
)


def add_tei_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of text-embeddings-router, under its own flag and variable."""
    from ember.tei_options import TEI_OPTIONS

    for option in TEI_OPTIONS:
        kwargs: dict[str, Any] = {"dest": TEI_DEST + option.name, "default": argparse.SUPPRESS}
        if option.switch:
            kwargs.update(nargs="?", const="true", metavar="true|false")
        else:
            kwargs.update(metavar=option.metavar, action="append" if option.many else "store")
        text = f"{'Refused: ' if option.refused else ''}{option.note} [env {option.env}]"
        flags = [flag(option.name), *([option.short] if option.short else [])]
        parser.add_argument(*flags, help=text.replace("%", "%%"), **kwargs)


def settings_from_tei_args(args: argparse.Namespace) -> ServerSettings:
    """`ember tei`: the router's flags over its variables, over ``EMBER_*``, over defaults
    (the router's port, else Ember's). Sets the variables the hub client and tracing read."""
    import os

    from ember.config import settings_from_env
    from ember.tei_options import tei_settings

    flags = {k.removeprefix(TEI_DEST): v for k, v in vars(args).items() if k.startswith(TEI_DEST)}
    resolved = tei_settings(flags, os.environ)
    if "model_id" not in resolved.settings and not os.environ.get(env_var("model_id")):
        raise ConfigError(
            "--model-id (MODEL_ID) is required, as text-embeddings-router requires it "
            "(`ember serve` serves the packaged model without one)"
        )
    os.environ.update(resolved.environ)
    settings = settings_from_env(command="tei", **resolved.settings)
    settings.compat_warnings.extend(resolved.warnings)
    return settings


def flag_table() -> str:
    """The flag table: the docs site's CLI page writes it at build time (docs/hooks)."""
    rows = ["| flag | env var | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in ServerSettings.model_fields.items():
        per_model = " (per model)" if name in PER_MODEL_FIELDS else ""
        default = _default_text(name)
        rows.append(
            f"| `{flag(name)}` | `{env_var(name)}` | {f'`{default}`' if default else ''} | "
            f"{(field.description or '').replace('|', chr(92) + '|')}{per_model} |"
        )
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Ember: serve retrieval models.")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", aliases=["v2"], help=SERVE_HELP, description=SERVE_HELP)
    add_settings_arguments(serve)
    add_infinity_arguments(serve)
    tei = sub.add_parser("tei", help=TEI_HELP, description=TEI_HELP)
    add_tei_arguments(tei)
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
    keys = sub.add_parser("keys", help="API keys for --api-keys-file.")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser(
        "hash",
        help='Read a key on stdin, print its `hash = "sha256:..."` line for the keys file '
        "(on stdin, not as an argument, so the key stays out of the shell history).",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """CLI values win over EMBER_* env vars, which win over defaults."""
    from ember.config import settings_from_env

    values = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields}
    infinity = {
        k.removeprefix(INFINITY_DEST): v
        for k, v in vars(args).items()
        if k.startswith(INFINITY_DEST)
    }
    return settings_from_env(infinity_flags=infinity, **values)


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


def _without_pydantic_v1() -> None:
    """FastAPI checks every route's types against pydantic's v1 models, importing
    ``pydantic.v1`` to do so (0.1 s of the slim image's start, for models Ember has none
    of); with the module marked absent it answers "not a v1 model" at once. The server's
    process only: nothing it runs uses pydantic v1."""
    sys.modules.setdefault("pydantic.v1", None)  # type: ignore[assignment]


def serve(settings: ServerSettings) -> int:
    from ember.logs import configure_logging

    configure_logging(settings.log_level, settings.json_logs)
    if settings.preload_only:
        return preload(settings)
    from ember.engine.array import EngineArray

    # The first model loads on a thread while the HTTP stack is imported and the app built
    # (~0.5 s of a 2-core host's start overlapped: ONNX Runtime builds a session outside
    # the GIL); the app's start takes the load over.
    engines = EngineArray.from_settings(settings)
    engines.begin_first_load()
    _without_pydantic_v1()
    import uvicorn

    _Server = _server_class()

    from ember.api.app import create_app
    from ember.api.connections import KEEP_ALIVE_TIMEOUT, connection_limits, http_protocol
    from ember.backends.gpu_check import no_gpu_visible_note

    if note := no_gpu_visible_note(settings.device):
        logging.getLogger("ember.cli").warning("%s", note)
    limits = connection_limits(settings)
    failed: list[BaseException] = []
    config = uvicorn.Config(
        "ember.api.app:create_app",  # placeholder, replaced below with the built app
        host=settings.host,
        port=settings.port,
        http=http_protocol(limits),
        ws="none",  # no WebSocket route: not importing a WebSocket stack saves ~20 ms a start
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
        log_config=None,
        access_log=settings.log_level == "debug",  # per-request lines cost throughput
        timeout_graceful_shutdown=10,
        root_path=settings.proxy_root_path or "",
    )
    server = _Server(config)

    def stop(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    config.app = create_app(settings, engines, on_load_failure=stop)
    server.run()
    if failed and isinstance(failed[0], EmberError):  # a start-up refusal: as main says one
        print(f"ember: error: {failed[0].message}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def preload(settings: ServerSettings) -> int:
    """--preload-only: download, convert, load and warm every model as serving would, then
    stop: an image build step leaves the weights and artifacts in the caches."""
    import asyncio

    from ember.engine.array import EngineArray

    engines = EngineArray(settings.model_specs())
    log = logging.getLogger("ember.cli")
    for line in settings.compat_warnings:  # create_app logs them when serving
        log.warning("%s", line)

    async def load() -> None:
        try:
            await engines.start()
        finally:
            await engines.stop()

    asyncio.run(load())
    log.info("preloaded %s; exiting", ", ".join(engines.names))
    return 0


def export(settings: ServerSettings, output: str) -> int:
    """Convert the one configured model for its backend into ``output``."""
    from dataclasses import replace
    from pathlib import Path

    from tqdm import tqdm

    from ember.backends.registry import exporter_module
    from ember.families.resolve import resolve_model

    module = exporter_module((settings.backend or "").strip().lower())
    specs = settings.model_specs()  # the checks serve makes
    if len(specs) != 1:
        raise ConfigError(f"ember export converts one model, got {len(specs)} (--model-id)")
    spec = replace(specs[0], device="cpu")
    model = resolve_model(spec)
    if not model.family.exportable:
        raise ConfigError(
            f"ember export writes dense, rerank and classify models; {model.served_name} is a "
            f"{model.family.name} model, whose heads live beside the network: serve its own "
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
        if args.command in ("serve", "v2"):
            return serve(settings_from_args(args))
        if args.command == "tei":
            return serve(settings_from_tei_args(args))
        if args.command == "embed":
            return run_embed(args, settings_from_args(args))
        if args.command == "keys":
            from ember.api.keys import hash_command

            print(hash_command(sys.stdin.readline()))
            return 0
        return export(settings_from_args(args), args.output)
    except EmberError as exc:
        print(f"ember: error: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
