"""The benchmark's pictures and the job-vs-server report: what is drawn, what is left out,
and that docs/performance.md shows the chart beside the table it cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import chart, job
from tests.support import REPO


def _result() -> dict:
    def load(rate: float, **extra: object) -> dict:
        return {"items_per_s": rate, "errors": 0, **extra}

    return {
        "meta": {"date": "2026-12-01", "cpu": "test CPU"},
        "rows": [
            {"server": "ember-a", "family": "ember", "loads": {"a": load(200), "b": load(150)}},
            {
                "server": "infinity-b",
                "family": "infinity",
                "loads": {"a": load(90, timed_out=True)},
            },
            {
                "server": "broken",
                "family": "ember",
                "loads": {"a": {"items_per_s": 5, "errors": 3}},
            },
            {"server": "failed", "family": "ember", "error": "did not start"},
        ],
    }


def test_bars_keep_clean_runs_and_flag_cut_ones() -> None:
    assert chart.bars(_result(), "a") == [
        ("ember-a", 200.0, "ember", False),
        ("infinity-b", 90.0, "infinity", True),
    ]
    assert chart.bars(_result(), "d") == []


def test_chart_is_a_png_with_one_panel_per_load(tmp_path: Path) -> None:
    from PIL import Image

    path = chart.throughput_chart(_result(), tmp_path / "r.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wide = Image.open(path).size
    one = chart.throughput_chart({"rows": _result()["rows"][1:2]}, tmp_path / "one.png")
    assert one is not None and Image.open(one).size[0] < wide[0]  # loads (a), (b) vs (a)
    assert chart.throughput_chart({"rows": []}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_job_report_compares_medians_with_the_servers_best_load() -> None:
    summary = job.compare({"a": [100, 120, 110], "b": [90, 95, 130]}, [118, 104, 121])
    assert summary["server_best_load"] == "a" and summary["server_best"] == 110
    assert summary["job_median"] == 118 and summary["job_vs_server_best"] == pytest.approx(1.073)


def test_the_performance_page_shows_the_chart_of_the_table_it_cites() -> None:
    speed = (REPO / "docs" / "performance.md").read_text()
    table = re.search(r"benchmarks/results/([\w.-]+)\.md", speed)
    assert table is not None
    picture = f"benchmarks/results/{table.group(1)}.png"
    assert f"](../{picture})" in speed, f"docs/performance.md should show {picture}"
    assert (REPO / picture).is_file()
