"""The HTTP API page's route table (docs/api/index.md) names every model route the app serves."""

from __future__ import annotations

import re

from ember.api.routes import ROUTES
from tests.support import REPO


def test_every_route_is_in_the_api_table() -> None:
    page = (REPO / "docs" / "api" / "index.md").read_text()
    table = page.split("\n## Routes\n")[1].strip().split("\n\n")[0]
    listed = set(re.findall(r"`(?:POST |GET )?(/[a-z0-9_/]*)`", table))
    served = {path for route in ROUTES for path in route.paths}
    assert served <= listed, sorted(served - listed)
