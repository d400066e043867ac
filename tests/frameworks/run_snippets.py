"""Run every snippet of docs/frameworks.md in the frameworks' venv; print what each produced.

Runs under the frameworks' own Python (not Ember's venv), so it imports nothing from Ember or
the tests. Usage: run_snippets.py PAGE SUBSTITUTIONS_JSON. Each snippet is the ```python block
after a ``<!-- snippet: NAME -->`` line (``<!-- snippet: NAME (no key) -->`` for a client that
cannot send a key); the page's placeholders (URL, key, model names) are replaced by the test
server's (SUBSTITUTIONS_JSON maps "key" and "no key" to a placeholder -> value map each).
A snippet leaves ``texts`` and ``vectors`` (embedders) or ``query``, ``documents`` and
``ranking`` ([(index, score)] best first, rerankers); one that raises reports its traceback,
so one broken framework does not hide the others.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import traceback
from pathlib import Path

SNIPPET = re.compile(
    r"<!-- snippet: (?P<name>[\w-]+)(?P<nokey> \(no key\))? -->\n```python\n(?P<code>.*?)```", re.S
)
KEPT = ("texts", "vectors", "query", "documents", "ranking")


def snippets(page: str, subs: dict[str, dict[str, str]]) -> dict[str, str]:
    """Name -> code of each tagged block, in page order, with its server's values put in."""
    found = {}
    for m in SNIPPET.finditer(page):
        code = m["code"]
        for placeholder, value in subs["no key" if m["nokey"] else "key"].items():
            code = code.replace(placeholder, value)
        found[m["name"]] = code
    return found


def run(code: str) -> dict[str, object]:
    """Execute one snippet; keep the names the test compares, as plain JSON values."""
    scope: dict[str, object] = {"__name__": "__snippet__"}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            exec(compile(code, "<snippet>", "exec"), scope)
    except BaseException:  # noqa: BLE001 - any failure is this snippet's result
        return {"error": traceback.format_exc()}
    out = {k: scope[k] for k in KEPT if k in scope}
    if "vectors" in out:
        out["vectors"] = [[float(x) for x in v] for v in out["vectors"]]  # type: ignore[union-attr]
    if "ranking" in out:
        out["ranking"] = [[int(i), float(s)] for i, s in out["ranking"]]  # type: ignore[union-attr]
    return out


def main() -> None:
    page = Path(sys.argv[1]).read_text()
    results = {name: run(code) for name, code in snippets(page, json.loads(sys.argv[2])).items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
