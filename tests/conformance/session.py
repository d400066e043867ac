"""The conformance kit's session: each family's tiny model built once, its reference
computed once, and one real `ember serve` per backend serving every family that claims it.

Servers run one at a time (the tests come backend by backend). A backend's server that
cannot start is started again without the family its error names (else one server per
family), so a family that fails there fails its own test, with its own log, and the
others still run. The models are built, then the references computed, in one background
thread, in the order the tests need them: the references take the CPU the starting
servers leave idle (each server loads its models one after another).

A backend that runs a family only on a condition (``Family.conditions``) serves the
reference's variant that meets it (its ``VARIANTS[backend]``), and its references are
computed on that variant; a family without one fails on that backend.
"""

from __future__ import annotations

import contextlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from ember.families.registry import FAMILIES, by_name
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

    def __init__(self, root: Path, tests: list[tuple[str, str]]) -> None:
        self.root = root
        self.references: dict[str, ModuleType] = modules()
        # Per test, the example's model (a conditional backend's test starts it to see
        # it refused) and, where the backend is conditional, its variant.
        models = [(f, k) for f, b in tests for k in (None, variant(f, b)) if self._has(f, b)]
        known = list(dict.fromkeys(models))
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="conformance-references")
        self._paths = {m: self._worker.submit(self._build, *m) for m in known}
        self._probes = {m: self._worker.submit(self._reference_probes, *m) for m in known}
        self._running: tuple[str, frozenset[str], ServerProcess] | None = None
        self._stack = contextlib.ExitStack()
        self._broken: dict[str, dict[str, str]] = {}  # backend -> family -> its start log
        self._alone: set[str] = set()  # backends whose shared server failed for no one model

    def reference(self, family: str) -> ModuleType:
        return self.references[module_name(family)]

    def path(self, family: str, backend: str | None = None) -> Path:
        """The tiny model the family is served as on ``backend``: its example's, or the
        variant that meets the backend's condition (waits for its build)."""
        return self._paths[self.require(family, backend)].result(timeout=BUILD_TIMEOUT)

    def probes(self, family: str, backend: str | None = None) -> list[kit.Probe]:
        """The probes of that model with their reference answers (waits for them)."""
        return self._probes[self.require(family, backend)].result(timeout=BUILD_TIMEOUT)

    def require(self, family: str, backend: str | None) -> tuple[str, str | None]:
        """The key of the family's model for ``backend``; fails, saying what to add, where
        the reference or the variant a conditional backend needs is missing."""
        assert module_name(family) in self.references, (
            f"{family} has no reference module: add tests/conformance/references/"
            f"{module_name(family)}.py (tests/conformance/README.md)"
        )
        condition = by_name(family).condition(backend) if backend else None
        assert condition is None or self._has(family, backend), (
            f"{family}'s row claims --backend {backend} only with {condition.words}, and "
            f"references/{module_name(family)}.py has no variant that meets it: add "
            f"VARIANTS[{backend!r}] (tests/conformance/README.md)"
        )
        key = (family, variant(family, backend) if backend else None)
        assert key in self._paths, f"{key} was not built for this session"
        return key

    def _has(self, family: str, backend: str | None) -> bool:
        """Whether the family has a reference with a model for ``backend``."""
        reference = self.references.get(module_name(family))
        key = variant(family, backend) if backend else None
        return reference is not None and (key is None or key in getattr(reference, "VARIANTS", {}))

    def _build(self, family: str, key: str | None) -> Path:
        reference = self.reference(family)
        if key is None:
            return reference.build(self.root / family)
        return reference.VARIANTS[key](self.root / f"{family}-{key}")

    def _reference_probes(self, family: str, key: str | None) -> list[kit.Probe]:
        return self.reference(family).probes(self._paths[family, key].result(BUILD_TIMEOUT))

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
        """The families whose rows claim ``backend`` (and that have a reference with a
        model for it)."""
        return frozenset(
            f.name for f in FAMILIES if f.runs_on(backend) and self._has(f.name, backend)
        )

    def _start(self, backend: str, families: frozenset[str]) -> ServerProcess:
        self.close()
        names = sorted(families)
        args = ["--model-id", ";".join(str(self.path(n, backend)) for n in names)]
        args += ["--served-model-name", ";".join(names), "--backend", backend]
        # float32 pinned: the references are fp32, whatever auto would pick on this CPU.
        # EMBER_CONFORMANCE_DEVICE=cuda runs the kit on a GPU (its torch rows) by hand.
        device = os.environ.get("EMBER_CONFORMANCE_DEVICE", "cpu")
        args += ["--device", device, "--dtype", "float32"]
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


def variant(family: str, backend: str) -> str | None:
    """Which model of the family's reference ``backend`` serves: the variant for it
    (named by the backend) where the row runs it only on a condition, else the example."""
    return backend if by_name(family).condition(backend) is not None else None


def pairs() -> list[tuple[str, str]]:
    """(family, backend) for every backend each registry row claims, backend by backend
    (RUNNABLE's order first: each backend's server starts once)."""
    order = [*RUNNABLE, *ELSEWHERE]
    claimed = {b for f in FAMILIES for b in f.backends}
    backends = order + sorted(claimed - set(order))
    return [(f.name, b) for b in backends for f in FAMILIES if b in f.backends]
