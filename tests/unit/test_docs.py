"""What a user reads first is true: README quickstart, the generated flag table, --help,
--version; and the docs site's generated parts are the code's (docs/hooks/ember_site.py)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys

from ember import __version__
from ember.backends.registry import EXPORTERS, REGISTRY
from ember.cli import build_parser, flag_table
from ember.config import BACKENDS, ServerSettings
from ember.infinity_options import infinity_cli_options
from tests.support import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"


def _hooks():
    """The mkdocs hook that writes the pages' generated parts at build time."""
    spec = importlib.util.spec_from_file_location("ember_site", DOCS / "hooks" / "ember_site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(page: str) -> str:
    """A page's markdown as the site builds it (markers expanded)."""
    return _hooks().expand_markers((DOCS / page).read_text())


CLI_PAGE = _built("reference/cli.md")


def test_quickstart_is_the_two_make_commands_first() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make serve", "make test"]


def test_cli_page_flag_table_is_generated_at_build() -> None:
    """The flag table is never written by hand: the page names it, the hook writes it."""
    assert "<!-- ember:flags -->" in (DOCS / "reference" / "cli.md").read_text()
    assert flag_table() in CLI_PAGE
    assert "<!-- ember:" not in CLI_PAGE
    for command in ("serve", "export", "embed", "keys"):
        usage = _subcommand(command).format_usage().split()[1:3]
        assert " ".join(usage) in CLI_PAGE, command


def test_environment_page_lists_every_setting() -> None:
    page = _built("reference/environment.md")
    for name in ServerSettings.model_fields:
        flag, env = "--" + name.replace("_", "-"), "EMBER_" + name.upper()
        assert f"| `{env}` | `{flag}` |" in page, name


def test_help_lists_exactly_the_table_flags() -> None:
    serve = next(a.choices["serve"] for a in build_parser()._actions if getattr(a, "choices", None))
    help_flags = {o for a in serve._actions for o in a.option_strings if o.startswith("--")}
    help_flags -= {"--help"}
    help_flags -= {"--" + o.name.replace("_", "-") for o in infinity_cli_options()}  # aliases
    help_flags = {f for f in help_flags if not f.startswith("--no-")}
    table_flags = set(re.findall(r"^\| `(--[a-z-]+)`", flag_table(), re.M))
    assert help_flags == table_flags
    assert len(table_flags) == len(ServerSettings.model_fields)
    out = subprocess.run(
        [sys.executable, "-m", "ember", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in table_flags:
        assert flag in out
        assert "EMBER_" + flag[2:].upper().replace("-", "_") in out


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ember", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == f"ember {__version__}"


def test_bad_config_exits_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ember", "serve", "--backend", "tensorflow"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--backend must be one of" in result.stderr


def _subcommand(name: str) -> argparse.ArgumentParser:
    return next(a.choices[name] for a in build_parser()._actions if getattr(a, "choices", None))


def test_backend_settings_are_in_help_and_table() -> None:
    """The settings the backends once read from the environment themselves."""
    help_text = _subcommand("serve").format_help()
    for name in ("cache_dir", *(n for n in ServerSettings.model_fields if n.startswith("neuron_"))):
        flag, env = "--" + name.replace("_", "-"), "EMBER_" + name.upper()
        assert f"| `{flag}` | `{env}` |" in CLI_PAGE
        assert flag in help_text and env in help_text
    assert "| `--neuron-batch-size` | `EMBER_NEURON_BATCH_SIZE` | `8` |" in CLI_PAGE


def test_every_registered_backend_is_documented_and_offered() -> None:
    """Adding a backend is one registration: the flags and docs follow it."""
    backends = (DOCS / "serving" / "backends.md").read_text().split("\n## ")[0]
    for name, entry in REGISTRY.items():
        assert f"| `{name}` |" in backends, name
        assert name in BACKENDS
        assert (name in EXPORTERS) == (entry.exporter is not None)
    assert f"({', '.join(EXPORTERS)})" in (_subcommand("export").description or "")


def test_the_tei_page_maps_to_flags_that_exist() -> None:
    """Each Ember flag the TEI page's table names is a setting of ``ember serve``."""
    page = (DOCS / "migrating" / "from-tei.md").read_text()
    table = page.split("## Or with `ember serve`")[1].split("\n\n")[2]
    named = re.findall(r"^\| `--[a-z-]+` \([^)]*\) \| `(--[a-z-]+)` \|", table, re.M)
    settings = {"--" + name.replace("_", "-") for name in ServerSettings.model_fields}
    assert len(named) >= 14 and set(named) <= settings, set(named) - settings


def test_the_tei_page_holds_ember_teis_generated_table() -> None:
    """The `ember tei` table is the one ``tei_options`` builds: the page cannot drift."""
    from ember.tei_options import tei_table

    page = (DOCS / "migrating" / "from-tei.md").read_text()
    assert tei_table() in page.split("## The server: `ember tei`")[1]
