"""The conformance kit's session: each family's tiny model built once, its reference
computed once, and one real `ember serve` per backend serving every family that claims it.

Servers run one at a time (the tests come backend by backend). A backend's server that
cannot start is started again without the family its error names (else one server per
family), so a family that fails there fails its own test, with its own log, and the
others still run. The models are built, then the references computed, in one background
thread, in the order the tests need them: the references take the CPU the starting
servers leave idle (each server loads its models one after another).
"""

from __future__ import annotations

import contextlib
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from ember.families import FAMILIES
from tests.conformance import kit
from tests.conformance.references import module_name, modules
from tests.support import ServerProcess, start_server

# The backends this kit runs, in the order their servers start; the others a row may
# claim are skipped with the reason here (a backend in neither list fails its test).
RUNNABLE = ("numpy", "torch", "onnx", "ct2")
ELSEWHERE = {"neuron": "needs AWS Inferentia2"}
BUILD_TIMEOUT = 600.0  # seconds for one family's build or references (bounded waits)


class Kit:
    """Models and references, made in the background in test order; servers, one at a
    time, on first use."""

    def __init__(self, root: Path, families: list[str]) -> None:
        self.root = root
        self.references: dict[str, ModuleType] = modules()
        known = [f for f in families if module_name(f) in self.references]
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="conformance-references")
        self._paths = {f: self._worker.submit(self._build, f) for f in known}
        self._probes = {f: self._worker.submit(self._reference_probes, f) for f in known}
        self._running: tuple[str, frozenset[str], ServerProcess] | None = None
        self._stack = contextlib.ExitStack()
        self._broken: dict[str, dict[str, str]] = {}  # backend -> family -> its start log
        self._alone: set[str] = set()  # backends whose shared server failed for no one model

    def reference(self, family: str) -> ModuleType:
        return self.references[module_name(family)]

    def path(self, family: str) -> Path:
        """The family's tiny model (waits for its build)."""
        self._require(family)
        return self._paths[family].result(timeout=BUILD_TIMEOUT)

    def probes(self, family: str) -> list[kit.Probe]:
        """The family's probes with their reference answers (waits for them)."""
        self._require(family)
        return self._probes[family].result(timeout=BUILD_TIMEOUT)

    def _require(self, family: str) -> None:
        assert family in self._probes, (
            f"{family} has no reference module: add tests/conformance/references/"
            f"{module_name(family)}.py (tests/conformance/README.md)"
        )

    def _build(self, family: str) -> Path:
        return self.reference(family).build(self.root / family)

    def _reference_probes(self, family: str) -> list[kit.Probe]:
        return self.reference(family).probes(self.path(family))

    def server(self, backend: str, family: str) -> ServerProcess:
        """A running server with ``family`` on ``backend``: the backend's shared one (less
        each family that stopped it starting), else the family's own; raises with the
        family's start log when it cannot start there."""
        broken = self._broken.setdefault(backend, {})
        while family not in broken:
            families = frozenset({family}) if backend in self._alone else self._claimed(backend)
            families -= broken.keys()
            if self._running and self._running[:2] == (backend, families):
                return self._running[2]
            try:
                return self._start(backend, families)
            except (RuntimeError, TimeoutError) as error:
                culprit = _culprit(str(error), families)
                if culprit is None and len(families) > 1:
                    self._alone.add(backend)
                else:
                    broken[culprit or family] = str(error)
        log = "\n".join(broken[family].splitlines()[-12:])
        raise AssertionError(f"{family} does not start on --backend {backend}:\n{log}")

    def _claimed(self, backend: str) -> frozenset[str]:
        """The families whose rows claim ``backend`` (and that have a reference)."""
        return frozenset(
            f.name
            for f in FAMILIES
            if backend in f.backends and module_name(f.name) in self.references
        )

    def _start(self, backend: str, families: frozenset[str]) -> ServerProcess:
        self.close()
        names = sorted(families)
        args = ["--model-id", ";".join(str(self.path(n)) for n in names)]
        args += ["--served-model-name", ";".join(names), "--backend", backend]
        # float32 pinned: the references are fp32, whatever auto would pick on this CPU.
        args += ["--device", "cpu", "--dtype", "float32"]
        args += ["--cache-dir", str(self.root / f"cache-{backend}")]
        server = self._stack.enter_context(start_server(args))
        self._running = (backend, families, server)
        return server

    def close(self) -> None:
        """Stop the running server."""
        self._running = None
        self._stack.close()

    def shutdown(self) -> None:
        self.close()
        self._worker.shutdown(cancel_futures=True)


def _culprit(log: str, families: frozenset[str]) -> str | None:
    """The family a failed start names in its last words (``ember: error: model 'x'``)."""
    named = re.findall(r"ember: error: model '([^']+)'", log)
    return named[-1] if named and named[-1] in families else None


def pairs() -> list[tuple[str, str]]:
    """(family, backend) for every backend each registry row claims, backend by backend
    (RUNNABLE's order first: each backend's server starts once)."""
    order = [*RUNNABLE, *ELSEWHERE]
    claimed = {b for f in FAMILIES for b in f.backends}
    backends = order + sorted(claimed - set(order))
    return [(f.name, b) for b in backends for f in FAMILIES if b in f.backends]
