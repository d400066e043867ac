"""Limits on a part and on the whole it belongs to are reconciled or refused at start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ember.config import ServerSettings, settings_from_env
from ember.config_limits import PAIRS, reconcile_limits
from ember.errors import ConfigError
from tests.support import child_env

MIB = 1024 * 1024


def test_the_defaults_never_conflict() -> None:
    settings = ServerSettings()
    for pair in PAIRS:
        part, whole = getattr(settings, pair.part), getattr(settings, pair.whole)
        assert float(part) <= float(whole), pair
    assert reconcile_limits(settings) == []
    assert settings_from_env().compat_warnings == []


# (part, whole, a part above the whole's default, a whole below the part's default)
CASES = [
    ("max_media_bytes", "max_request_media_bytes", 200_000_000, 5 * MIB),
    ("max_request_media_bytes", "max_fetched_bytes", 300 * MIB, 32 * MIB),
    ("max_client_batch_size", "max_queue_size", 8192, 64),
    ("body_timeout", "body_total_timeout", 90.0, 5.0),
]


def test_every_pair_is_covered() -> None:
    assert {(p.part, p.whole) for p in PAIRS} == {(part, whole) for part, whole, *_ in CASES}


@pytest.mark.parametrize(("part", "whole", "high", "low"), CASES)
def test_a_default_whole_is_raised_to_a_part_set_above_it(
    part: str, whole: str, high: float, low: float
) -> None:
    settings = settings_from_env(**{part: high})
    assert float(getattr(settings, whole)) == high
    line = next(line for line in settings.compat_warnings if f"--{whole.replace('_', '-')}" in line)
    assert line.startswith(f"--{whole.replace('_', '-')} raised from its default to ")
    assert "\n" not in line


@pytest.mark.parametrize(("part", "whole", "high", "low"), CASES)
def test_a_default_part_is_lowered_to_a_whole_set_below_it(
    part: str, whole: str, high: float, low: float
) -> None:
    settings = settings_from_env(**{whole: low})
    assert float(getattr(settings, part)) == low
    (line,) = [line for line in settings.compat_warnings if "lowered" in line]
    assert line.startswith(f"--{part.replace('_', '-')} lowered from its default to ")


@pytest.mark.parametrize(("part", "whole", "high", "low"), CASES)
def test_both_set_and_contradicting_is_refused_in_one_line(
    part: str, whole: str, high: float, low: float
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_env(**{part: high, whole: low})
    message = caught.value.message
    assert message.startswith(f"--{part.replace('_', '-')} ")
    assert f"is above --{whole.replace('_', '-')} " in message and "\n" not in message


def test_an_env_variable_counts_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MAX_REQUEST_MEDIA_BYTES", str(64 * MIB))
    with pytest.raises(ConfigError, match="--max-media-bytes 200000000 is above"):
        settings_from_env(max_media_bytes=200_000_000)


def test_the_issue_case_reaches_the_item_limit_and_the_chain_follows() -> None:
    """--max-media-bytes 200000000 alone: the request total (64 MiB) rises to it, and the
    server-wide bytes held (256 MiB) stay; past 256 MiB they rise too."""
    settings = settings_from_env(max_media_bytes=200_000_000)
    limits = settings.media_limits()
    assert (limits.max_bytes, limits.max_request_bytes) == (200_000_000, 200_000_000)
    assert limits.max_fetched_bytes == 256 * MIB and len(settings.compat_warnings) == 1
    bigger = settings_from_env(max_media_bytes=300 * MIB).media_limits()
    assert bigger.max_request_bytes == bigger.max_fetched_bytes == 300 * MIB


def test_a_per_model_queue_counts_at_its_largest() -> None:
    """One model's small queue is its own (its admission answers); every queue under the
    request cap makes the cap unreachable."""
    kept = settings_from_env(model_id="a;b", max_queue_size="4096;2")
    assert kept.max_client_batch_size == 2048 and kept.compat_warnings == []
    lowered = settings_from_env(model_id="a;b", max_queue_size="64;128")
    assert lowered.max_client_batch_size == 128
    assert [s.max_queue_size for s in lowered.model_specs()] == [64, 128]
    raised = settings_from_env(model_id="a;b", max_client_batch_size=8192)
    assert [s.max_queue_size for s in raised.model_specs()] == [8192, 8192]


def test_the_cli_refuses_contradicting_limits_in_one_line_at_start() -> None:
    """Through `ember serve` itself: exit 2, one line on stderr, no traceback, before any
    model is loaded."""
    result = subprocess.run(
        [sys.executable, "-m", "ember", "serve", "--max-media-bytes", "200000000"],
        env=child_env({"EMBER_MAX_REQUEST_MEDIA_BYTES": str(64 * MIB), "EMBER_PORT": "1"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "ember: error: --max-media-bytes 200000000 is above --max-request-media-bytes "
        "67108864: an item that large would be refused for the request's media bytes in "
        "all; lower the first or raise the second"
    ]
