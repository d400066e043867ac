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
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ember.errors import BackendFailure

T = TypeVar("T")
log = logging.getLogger(__name__)


def _log_setup() -> tuple[int, bool]:
    from ember.logs import JsonFormatter

    root = logging.getLogger()
    json_logs = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return root.getEffectiveLevel(), json_logs


def worth_a_child() -> bool:
    """False once torch is imported here (an embedding app, a test run): the memory is
    already spent, and a child would only add its own ~3 s of imports. False too where
    the interpreter is embedded (uwsgi, mod_wsgi: ``sys.executable`` is not Python)."""
    return "torch" not in sys.modules and "python" in Path(sys.executable or "").name.lower()


def _child_env() -> dict[str, str]:
    """This environment, plus the directory holding ``ember`` when it is not installed
    (a source checkout on PYTHONPATH); an installed one is found without help."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    if package_root not in site.getsitepackages() + [site.getusersitepackages()]:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), package_root) if p)
    return env


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
    with tempfile.TemporaryDirectory(prefix="ember-build-") as tmp:
        job_file, result_file = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        job_file.write_bytes(job)
        argv = [sys.executable, "-m", __name__, str(job_file), str(result_file)]
        code = subprocess.run(argv, env=_child_env(), check=False).returncode
        if not result_file.is_file():
            raise BackendFailure(
                f"the artifact build process ({function.__name__}) exited with status "
                f"{code} and no result; its log is above"
            )
        try:
            ok, value = pickle.loads(result_file.read_bytes())
        except Exception as exc:
            raise BackendFailure(f"the artifact build's result did not unpickle: {exc}") from exc
    if ok:
        return value
    raise value


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives a pickle round trip (some torch errors do not rebuild from
    their args), else a BackendFailure that keeps its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return BackendFailure(f"{type(exc).__name__}: {exc}")


def _main(job_file: str, result_file: str) -> int:
    function, args, (level, json_logs) = pickle.loads(Path(job_file).read_bytes())
    from ember.logs import configure_logging

    configure_logging("info", json_logs)
    logging.getLogger().setLevel(level)
    try:
        outcome: tuple[bool, Any] = (True, function(*args))
    except Exception as exc:  # raised in the parent (one line at start); traceback: debug
        log.debug("artifact build failed", exc_info=True)
        outcome = (False, _portable(exc))
    Path(result_file).write_bytes(pickle.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:3]))
