"""uvicorn's per-request refusal line (``Invalid HTTP request received.`` on
``uvicorn.error``) is rate-limited as Ember's own refusal logs are: the first line of an
interval goes out, the rest are counted into the next one; other lines pass untouched."""

from __future__ import annotations

import logging

import pytest

from ember.logs import UVICORN_REFUSALS, RateLimitedMessages, install_uvicorn_limits


def test_a_flood_of_one_message_is_folded_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("ember.test.flood")
    limit = RateLimitedMessages(("Invalid HTTP request received.",), interval=60)
    logger.addFilter(limit)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            for _ in range(50):
                logger.warning("Invalid HTTP request received.")
            logger.warning("something else")
            logger.warning("something else")
            assert [r.getMessage() for r in caplog.records] == [
                "Invalid HTTP request received.",
                "something else",
                "something else",
            ]
            limit._limits["Invalid HTTP request received."]._last -= 61  # the interval passed
            logger.warning("Invalid HTTP request received.")
        assert caplog.records[-1].getMessage() == (
            "Invalid HTTP request received. (+49 more like it in the last 60s)"
        )
    finally:
        logger.removeFilter(limit)


def test_installed_on_uvicorn_once() -> None:
    """``configure_logging`` installs it (the serve test sees it work); a second install,
    e.g. a second app in one process, replaces the first rather than stacking."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    before = uvicorn_log.filters[:]
    try:
        install_uvicorn_limits()
        install_uvicorn_limits()
        ours = [f for f in uvicorn_log.filters if isinstance(f, RateLimitedMessages)]
        assert len(ours) == 1 and set(ours[0]._limits) == set(UVICORN_REFUSALS)
    finally:
        uvicorn_log.filters[:] = before
