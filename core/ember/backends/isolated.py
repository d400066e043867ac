"""Build an artifact (ONNX export, CTranslate2 conversion) in a child Python process.

Why: exporting MiniLM to ONNX inside the serving process left that server idling at
1,033 MiB, since torch, transformers, the exporter and the optimizer stay imported and
their heap stays mapped; the same server opening the cached graph idles at 221 MiB. A
child that exits gives all of it back, so a first start ends as light as later ones.

The child is ``python -m ember.backends.isolated`` rather than ``multiprocessing``:
spawn re-imports the parent's ``__main__``, which a platform's entry script may not
guard. Job and result travel as pickles in a private temp dir; the child logs to the
same stderr at the parent's level and format.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ember.errors import BackendFailure

T = TypeVar("T")
log = logging.getLogger(__name__)


def _log_setup() -> tuple[str, bool]:
    from ember.logs import JsonFormatter

    root = logging.getLogger()
    json_logs = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return logging.getLevelName(root.getEffectiveLevel()), json_logs


def worth_a_child() -> bool:
    """False once torch is imported here (an embedding app, a test run): the memory is
    already spent, and a child would only add its own ~3 s of imports."""
    return "torch" not in sys.modules and bool(sys.executable)


def run(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a child process; its exception is raised here.

    ``function`` must be importable by name and its arguments picklable; when they are
    not (a progress callback from a caller, say), or a child is not worth it, it runs
    in this process instead.
    """
    if not worth_a_child():
        return function(*args)
    try:
        job = pickle.dumps((function, args, _log_setup()))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        log.debug("building in-process: the job does not pickle (%s)", exc)
        return function(*args)
    package_root = str(Path(__file__).resolve().parents[2])  # the dir holding `ember`
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="ember-build-") as tmp:
        job_file, result_file = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        job_file.write_bytes(job)
        argv = [sys.executable, "-m", __name__, str(job_file), str(result_file)]
        code = subprocess.run(argv, env=env, check=False).returncode
        if not result_file.is_file():
            raise BackendFailure(
                f"the artifact build process ({function.__name__}) exited with status "
                f"{code} and no result; its log is above"
            )
        ok, value = pickle.loads(result_file.read_bytes())
    if ok:
        return value
    raise value


def _main(job_file: str, result_file: str) -> int:
    function, args, (level, json_logs) = pickle.loads(Path(job_file).read_bytes())
    from ember.logs import configure_logging

    configure_logging(level, json_logs)
    try:
        outcome: tuple[bool, Any] = (True, function(*args))
    except Exception as exc:  # handed to the parent, which raises it
        outcome = (False, exc)
    try:
        payload = pickle.dumps(outcome)
    except (pickle.PicklingError, AttributeError, TypeError):
        exc = outcome[1]
        payload = pickle.dumps((False, BackendFailure(f"{type(exc).__name__}: {exc}")))
    Path(result_file).write_bytes(payload)
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:3]))
