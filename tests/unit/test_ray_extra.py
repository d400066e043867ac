"""Ray is an extra: nothing imports it unless asked, and without it `--ray` and `ember.ray`
say, in one line, what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import REPO, child_env

HIDE_RAY = "import sys; sys.modules['ray'] = None; "  # `import ray` then fails as if absent


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=child_env(drop_prefixes=("EMBER_",)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_and_the_in_process_job_do_not_import_ray() -> None:
    done = _python(
        "import sys; import ember.cli, ember.jobs.runner, ember.jobs.command, ember.platform; "
        "print('ray' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_without_ray_embed_ray_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n")
    argv = [str(corpus), "--output", str(tmp_path / "o"), "--no-progress", "--ray"]
    done = _python(HIDE_RAY + f"from ember.cli import main; sys.exit(main(['embed', *{argv!r}]))")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ember: error: Ray is not installed: pip install 'ember[ray]'"
    ]
    assert not (tmp_path / "o").exists()  # refused before the output was made


def test_without_ray_the_python_api_says_what_to_install() -> None:
    done = _python(HIDE_RAY + "import ember.ray")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: Ray is not installed: pip install 'ember[ray]'"
    )
