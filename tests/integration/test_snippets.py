"""Every code block in README.md and docs/ runs here, or says in the page why it cannot.

The collector reads each fenced block with markdown-it (as the site renders it) and the
HTML comment on the line before it:

- no comment: ``bash``/``sh`` blocks run in bash against one real ``ember serve`` started
  here on 127.0.0.1 (the packaged MiniLM and two tiny models built by the suite, under the
  names the pages use: docs/api/index.md, "The examples' server"), with the pages' port
  7997 replaced by the server's and ``curl`` failing on an HTTP error; ``python`` blocks run
  in a subprocess against the same server; ``json``, ``yaml`` and ``toml`` blocks parse;
  ``text`` blocks are prose (outputs, trees, diagrams);
- ``<!-- response -->``: a ``json`` block that shows what the block before it answers; the
  answer must have the example's shape (the same keys and types, lists by their first item);
- ``<!-- not-run: WHY -->``: cannot run here (a cloud deploy, a hub download, a GPU); checked
  for syntax only (``bash -n``, ``ast.parse``, the data formats' parsers);
- ``<!-- snippet: NAME -->``: run by tests/integration/test_frameworks.py in the frameworks'
  own venv; checked for syntax here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from tests.support import REPO, ServerProcess, child_env, start_server

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUN = {"bash", "sh", "python"}
DATA = {"json", "yaml", "toml"}
KNOWN = RUN | DATA | {"text"}
COMMENT = re.compile(r"^\s*<!-- (not-run|response|snippet)(?::\s*(.+?))?\s*-->\s*$")
DOCS_PORT = "7997"
# The names docs/api/index.md's server serves: the tests' models stand in for them.
EMBEDDER, RERANKER, CLASSIFIER = (
    "sentence-transformers/all-MiniLM-L6-v2",
    "cross-encoder/ms-marco-MiniLM-L6-v2",
    "classifier",
)
# curl as the pages use it, but an HTTP error fails the block (bounded in time).
CURL = 'curl() { command curl --fail-with-body --show-error --max-time 60 "$@"; }\n'


@dataclass
class Block:
    """One fenced block, where it stands, and what its page says of it."""

    page: Path
    line: int  # 1-based, the fence's
    lang: str
    code: str
    mark: str | None  # not-run, response, snippet or None
    why: str
    response: str | None = None  # the `<!-- response -->` block after it

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def collect(page: Path) -> list[Block]:
    """The page's blocks, each response attached to the block before it."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    blocks: list[Block] = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start = token.map[0]
        before = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        found = COMMENT.match(before)
        mark, why = (found.group(1), found.group(2) or "") if found else (None, "")
        lang = (token.info.split() or [""])[0]
        block = Block(page, start + 1, lang, token.content, mark, why)
        if mark == "response":
            assert blocks and blocks[-1].mark is None, f"{block.id}: a response to no run block"
            blocks[-1].response = token.content
        blocks.append(block)
    return blocks


BLOCKS = [block for page in PAGES for block in collect(page)]
RUNS = [b for b in BLOCKS if b.mark is None and b.lang in RUN]


def check_syntax(block: Block) -> None:
    """Parse the block as its language: what every block gets, run or not."""
    if block.lang in ("bash", "sh"):
        done = subprocess.run(
            ["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, f"{block.id}: {done.stderr}"
    elif block.lang == "python":
        ast.parse(textwrap.dedent(block.code), filename=block.id)
    elif block.lang == "json":
        json.loads(block.code)
    elif block.lang == "yaml":
        list(yaml.safe_load_all(block.code))
    elif block.lang == "toml":
        tomllib.loads(block.code)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_every_block_is_known_and_parses(block: Block) -> None:
    assert block.lang in KNOWN, f"{block.id}: name the block's language, one of {sorted(KNOWN)}"
    if block.mark == "not-run":
        assert len(block.why) > 10, f"{block.id}: say why it cannot run here"
    if block.mark == "snippet":  # test_frameworks.py runs every one of that page's
        assert block.page.name == "frameworks.md", block.id
    if block.mark is None and block.lang not in RUN | {"text"}:
        assert block.lang in DATA
    check_syntax(block)


def test_the_collector_finds_the_pages_blocks() -> None:
    """Every page's fences are seen (a block markdown-it misses would go untested)."""
    fences = sum(
        len(re.findall(r"^ *```[a-z]", page.read_text(encoding="utf-8"), re.M)) for page in PAGES
    )
    assert len(BLOCKS) == fences
    assert len(RUNS) >= 20 and {b.page.name for b in RUNS} >= {"README.md", "tei.md", "vllm.md"}


def shape(value: object) -> object:
    """What a JSON value looks like: keys and types; a list by its first item."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


@pytest.fixture(scope="module")
def docs_server(
    minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path
) -> Iterator[ServerProcess]:
    """The pages' server: their three model names, no key, on torch (no export to wait for)."""
    models = ";".join(map(str, (minilm_path, tiny_reranker_path, tiny_classifier_path)))
    args = ["--model-id", models, "--served-model-name", f"{EMBEDDER};{RERANKER};{CLASSIFIER}"]
    with start_server([*args, "--backend", "torch", "--dtype", "float32"]) as server:
        yield server


def scratch(where: Path) -> Path:
    """A directory that looks like the repository's root (its folders linked, so what a
    block writes stays out of the tree), with the input files the pages' jobs read."""
    for name in ("core", "benchmarks", "deploy", "examples", "platforms"):
        (where / name).symlink_to(REPO / name)
    rows = [{"doc_id": f"d{i}", "text": text} for i, text in enumerate(("a cat", "a dog"))]
    (where / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    line = {"custom_id": "q1", "method": "POST", "url": "/v1/embeddings"}
    line["body"] = {"input": ["a", "b"]}
    (where / "requests.jsonl").write_text(json.dumps(line) + "\n")
    return where


@pytest.mark.parametrize("block", RUNS, ids=[b.id for b in RUNS])
def test_block_runs(block: Block, docs_server: ServerProcess, tmp_path: Path) -> None:
    host = docs_server.url.removeprefix("http://")
    code = textwrap.dedent(block.code)
    for name in ("127.0.0.1", "localhost"):
        code = code.replace(f"{name}:{DOCS_PORT}", host)
    env = child_env(
        {
            "HF_HUB_OFFLINE": "0",  # huggingface_hub refuses even a loopback URL offline
            "EMBER_BACKEND": "torch",  # in-process engines: no ONNX export to wait for
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        },
        drop_prefixes=("EMBER_",),
    )
    env["EMBER_CACHE_DIR"] = os.environ["EMBER_CACHE_DIR"]
    if block.lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", CURL + code]
    done = subprocess.run(
        argv, cwd=scratch(tmp_path), env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{block.id}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if block.response is not None:
        answer = json.loads(done.stdout)
        assert shape(answer) == shape(json.loads(block.response)), (block.id, done.stdout[:2000])
