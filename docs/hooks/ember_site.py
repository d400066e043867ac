"""mkdocs hook: the pages' generated parts come from the code at build time, so they cannot drift.

A page names what it wants with a marker on a line of its own:

- ``<!-- ember:flags -->``: the ``ember serve`` flag table (``ember.cli.flag_table``);
- ``<!-- ember:env -->``: every ``EMBER_*`` variable, its flag and default (``ServerSettings``);
- ``<!-- ember:help COMMAND -->``: ``ember COMMAND --help`` as the CLI parser prints it;
- ``<!-- ember:supported-models -->``: the family registry's table (``ember.families.table``);
- ``<!-- ember:metrics -->``: the Prometheus metrics a server exports (``ember.metrics``);
- ``<!-- ember:openapi -->``: the OpenAPI schema of the app, rendered as pages of text.

Links from a page to files of the repository outside ``docs/`` (benchmark results, sources)
stay links on GitHub; in the built site a picture is copied in and anything else becomes its
repository path in code type (the site is offline: there is no host to link to).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

from ember.api.app import create_app
from ember.cli import PER_MODEL_FIELDS, _default_text, build_parser, env_var, flag, flag_table
from ember.config import ServerSettings, settings_from_env
from ember.families.table import supported_models_table
from ember.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- ember:([a-z-]+)(?: ([a-z-]+))? -->$", re.M)
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
PICTURES = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")
COPIED = "assets/repo"  # where pictures from outside docs/ land in the site
OPENAPI_FILE = "reference/openapi.json"


def _cell(text: object) -> str:
    """Text fit for one table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def env_table() -> str:
    """Every setting's environment variable, flag and default."""

    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in ServerSettings.model_fields.items():
        default = _default_text(name)
        per_model = " (per model: `;`-separated)" if name in PER_MODEL_FIELDS else ""
        rows.append(
            f"| `{env_var(name)}` | `{flag(name)}` | {f'`{default}`' if default else ''} | "
            f"{_cell(field.description or '')}{per_model} |"
        )
    return "\n".join(rows)


def command_help(command: str) -> str:
    """``ember COMMAND --help``, as a text block (a fixed width, so the build is stable)."""

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None))
    with mock.patch.dict(os.environ, {"COLUMNS": "100"}):  # argparse wraps at COLUMNS
        text = sub.choices[command].format_help()  # type: ignore[index]
    return f"```text\n{text.rstrip()}\n```"


def metrics_table() -> str:
    """The metrics of one served app's registry: name, type, labels, help."""

    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for family in Metrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        described = getattr(family, "documentation", "")
        rows.append(
            f"| `{name}` | {family.type} | {', '.join(f'`{x}`' for x in labels)} | "
            f"{_cell(described)} |"
        )
    return "\n".join(rows)


@cache
def openapi() -> dict[str, Any]:
    """The schema the app serves at /openapi.json (no model is loaded to make it)."""

    return create_app(settings_from_env()).openapi()


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, with links to the named schemas it uses."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " \\| ".join(_type(s) for s in schema[key])
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    return str(kind)


def openapi_markdown() -> str:
    """The schema as text: each operation by tag, then each named schema's fields."""
    spec = openapi()
    out = [
        f"Generated from the app at build time: OpenAPI {spec['openapi']}, "
        f"{spec['info']['title']} {spec['info']['version']}. "
        f"The same schema as JSON: [openapi.json](openapi.json).",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            by_tag.setdefault((op.get("tags") or ["Other"])[0], []).append((path, method, op))
    for tag, ops in by_tag.items():
        out.append(f"## {tag}")
        for path, method, op in ops:
            out.append(f"### `{method.upper()} {path}`")
            out.append(_cell(op.get("summary", "")))
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out.append(f"Request body (`{media}`): {_type(content.get('schema', {}))}")
            rows = ["| status | meaning | body |", "| --- | --- | --- |"]
            for status, answer in op.get("responses", {}).items():
                kinds = [
                    f"`{media}` {_type(c.get('schema', {}))}"
                    for media, c in answer.get("content", {}).items()
                ]
                rows.append(
                    f"| {status} | {_cell(answer.get('description', ''))} | {'; '.join(kinds)} |"
                )
            out.append("\n".join(rows))
    out.append("## Schemas")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out.append(f"### {name}")
        if schema.get("description"):
            out.append(_cell(schema["description"]))
        props = schema.get("properties")
        if not props:
            out.append(f"Type: {_type(schema)}")
            continue
        required = set(schema.get("required", []))
        rows = ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
        for field, sub in props.items():
            default = f" Default: `{json.dumps(sub['default'])}`." if "default" in sub else ""
            rows.append(
                f"| `{field}` | {_type(sub)} | {'yes' if field in required else ''} | "
                f"{_cell(sub.get('description', ''))}{default} |"
            )
        out.append("\n".join(rows))
    return "\n\n".join(out)


GENERATORS: dict[str, Callable[[str], str]] = {  # marker name -> its text, given its argument
    "flags": lambda _: flag_table(),
    "env": lambda _: env_table(),
    "help": command_help,
    "supported-models": lambda _: supported_models_table(),
    "metrics": lambda _: metrics_table(),
    "openapi": lambda _: openapi_markdown(),
}


def expand_markers(markdown: str) -> str:
    """Each ``<!-- ember:NAME [ARG] -->`` line replaced by what the code generates."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](m.group(2) or ""), markdown)


def outside_docs(page_src: str, target: str) -> str | None:
    """The repository path a page's relative link points to when it is outside docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_src), path))
    if joined.startswith(("docs/", "../")) or joined == "docs":
        return None
    return joined + ("/" if path.endswith("/") else "")


def relink(markdown: str, page_src: str) -> str:
    """Links out of docs/: a picture points at its copy, anything else is its repo path."""

    def fix(m: re.Match[str]) -> str:
        bang, text, target = m.groups()
        repo_path = outside_docs(page_src, target)
        if repo_path is None:
            return m.group(0)
        if bang and repo_path.endswith(PICTURES):
            up = posixpath.relpath(f"{COPIED}/{repo_path}", posixpath.dirname(page_src) or ".")
            return f"![{text}]({up})"
        shown = f"`{repo_path}`"
        return shown if text.strip("`") == repo_path else f"{text} ({shown})"

    # only outside fenced code: a snippet's text is left as it is
    parts = re.split(r"(^ *```.*?^ *```)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else LINK.sub(fix, p) for i, p in enumerate(parts))


def pictures_outside_docs(docs_dir: Path) -> set[str]:
    """Repository paths of the pictures the pages show from outside docs/."""
    found = set()
    for page in docs_dir.rglob("*.md"):
        src = page.relative_to(docs_dir).as_posix()
        for bang, _, target in LINK.findall(page.read_text(encoding="utf-8")):
            repo_path = outside_docs(src, target)
            if bang and repo_path and repo_path.endswith(PICTURES):
                found.add(repo_path)
    return found


# mkdocs' hook events -------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Add the pictures from outside docs/ and the OpenAPI schema as JSON."""
    from mkdocs.structure.files import File

    for repo_path in sorted(pictures_outside_docs(Path(config["docs_dir"]))):
        files.append(
            File.generated(config, f"{COPIED}/{repo_path}", abs_src_path=str(ROOT / repo_path))
        )
    files.append(File.generated(config, OPENAPI_FILE, content=json.dumps(openapi(), indent=1)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The page's markers expanded and its links out of docs/ made to work in the site."""
    return relink(expand_markers(markdown), page.file.src_uri)
