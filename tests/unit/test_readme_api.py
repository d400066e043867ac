"""The README's HTTP API table names every model route the app serves."""

from __future__ import annotations

import re

from ember.api.routes import ROUTES
from tests.support import REPO


def test_every_route_is_in_the_api_table() -> None:
    readme = (REPO / "README.md").read_text()
    table = readme.split("## HTTP API")[1].split("\n\n")[1]
    listed = set(re.findall(r"`(?:POST |GET )?(/[a-z0-9_/]*)`", table))
    served = {path for route in ROUTES for path in route.paths}
    assert served <= listed, sorted(served - listed)
