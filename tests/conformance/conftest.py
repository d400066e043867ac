"""The conformance kit's one fixture: its session (tests/conformance/session.py), ended
with the module so that no server of its outlives the kit's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.session import Kit, pairs


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    session = Kit(tmp_path_factory.mktemp("conformance"), pairs())
    try:
        yield session
    finally:
        session.shutdown()
