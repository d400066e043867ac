"""Bar charts of a benchmark's throughput, written beside its Markdown table.

One panel per load, one bar per server, longest bar on top: people compare bars faster
than columns of figures. Reads the same ``{"meta", "rows"}`` JSON ``run.py`` writes (and
``job.py``), so any results file can be drawn again:

    .venv/bin/python benchmarks/chart.py benchmarks/results/2026-12-01-cpu-pipeline.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (load key, panel title, unit). Latency (c) is not a throughput: it stays in the table.
PANELS: tuple[tuple[str, str, str], ...] = (
    ("a", "(a) 32 sentences x 4 clients", "sentences/s"),
    ("b", "(b) 1 sentence x 32 clients", "sentences/s"),
    ("d", "(d) rerank 1 x 32 documents", "documents/s"),
    ("job", "corpus job vs served", "sentences/s"),
)
FAMILY_COLOURS = {"ember": "#d9480f", "job": "#862e9c", "infinity": "#1c7ed6", "st": "#868e96"}


def bars(result: dict[str, Any], load: str) -> list[tuple[str, float, str, bool]]:
    """(server, rate, family, cut short) of every row that ran ``load`` without errors."""
    out = []
    for row in result.get("rows", []):
        run = row.get("loads", {}).get(load)
        if not run or run.get("errors", 0) or not run.get("items_per_s"):
            continue
        out.append(
            (
                row["server"],
                float(run["items_per_s"]),
                row.get("family", ""),
                bool(run.get("timed_out")),
            )
        )
    return out


def throughput_chart(result: dict[str, Any], path: Path, title: str | None = None) -> Path | None:
    """Draw every load that has bars into ``path`` (PNG); None when no load has any."""
    import matplotlib

    matplotlib.use("Agg")  # no display: this runs on servers and in CI
    import matplotlib.pyplot as plt

    panels = [(key, name, unit, bars(result, key)) for key, name, unit in PANELS]
    panels = [p for p in panels if p[3]]
    if not panels:
        return None
    height = max(len(p[3]) for p in panels) * 0.32 + 1.3
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), height), squeeze=False, layout="constrained"
    )
    for ax, (_, name, unit, rows) in zip(axes[0], panels, strict=True):
        rows = sorted(rows, key=lambda r: r[1])
        labels = [server + (" *" if cut else "") for server, _, _, cut in rows]
        values = [rate for _, rate, _, _ in rows]
        colours = [FAMILY_COLOURS.get(family, "#495057") for _, _, family, _ in rows]
        ax.barh(labels, values, color=colours)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:,.0f}", va="center", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(unit)
        ax.set_xlim(0, max(values) * 1.18)
        ax.tick_params(axis="y", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    meta = result.get("meta", {})
    fig.suptitle(title or f"{meta.get('date', '')}: {meta.get('cpu', '')}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    import json

    for name in argv if argv is not None else sys.argv[1:]:
        source = Path(name)
        written = throughput_chart(json.loads(source.read_text()), source.with_suffix(".png"))
        print(f"wrote {written}" if written else f"{source}: no throughput to draw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
