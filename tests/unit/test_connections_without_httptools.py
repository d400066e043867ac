"""Without httptools (uvicorn[standard]'s extra) the core imports and serves on uvicorn's
default protocol, warning that connection deadlines are off: a platform image that lacks
it must start (the Bento's image once failed at import instead)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import child_env

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "httptools" or name.endswith("httptools_impl"):
            raise ImportError(name)
sys.meta_path.insert(0, Block())
from ember.api.connections import ConnectionLimits, http_protocol
print(http_protocol(ConnectionLimits()))
"""


def test_the_core_imports_and_falls_back_without_httptools() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "auto"
    assert "httptools is not installed" in proc.stderr
