"""Every registry family, on every backend its row claims, against its reference library.

For each (family, backend) of ``ember.families.registry.FAMILIES``: the family's reference module
(tests/conformance/references/) builds the tiny seeded model its row's example names,
a real `ember serve` serves it on that backend in fp32, and each probe's answer over HTTP
must match what the reference library computed (tests/conformance/kit.py has the
tolerances). The server must list it as that family on that backend, and the probes must
cover every capability the row claims. A backend this machine cannot have (neuron) is
skipped with its reason; a backend the kit does not know fails.

A backend the row claims only on a condition (``Family.conditions``: ColBERT on ct2, with
query expansion attended or off) serves the reference's variant that meets it, matched the
same way, and must refuse the example itself at start: exit status 2 and one line naming
the backend and the condition. A reference with no such variant fails.
"""

from __future__ import annotations

import httpx
import pytest

from ember.families.base import Condition
from ember.families.registry import FAMILIES, by_name
from tests.conformance.kit import Probe
from tests.conformance.references import module_name, modules
from tests.conformance.session import ELSEWHERE, RUNNABLE, Kit, pairs
from tests.support import start_server


@pytest.mark.parametrize(("family", "backend"), pairs(), ids=lambda v: v)
def test_family_matches_its_reference(conformance: Kit, family: str, backend: str) -> None:
    if backend in ELSEWHERE:
        pytest.skip(ELSEWHERE[backend])
    assert backend in RUNNABLE, (
        f"{family}'s row claims --backend {backend}, which the conformance kit does not run: "
        "add it to RUNNABLE (tests/conformance/session.py) or to ELSEWHERE with the reason"
    )
    conformance.require(family, backend)  # a conditional backend's variant is there
    server = conformance.server(backend, family)  # the references finish meanwhile
    probes = conformance.probes(family, backend)
    uncovered = set(by_name(family).capabilities) - {p.capability for p in probes}
    assert not uncovered, f"{family} claims {sorted(uncovered)} but its reference checks none"
    with server.client() as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}[family]
        assert listed["kind"] == family, f"served as {listed['kind']}, not {family}"
        assert backend in listed["backend"].split("+"), f"served on {listed['backend']}"
        outcomes = [_check(client, family, probe) for probe in probes]
    print(f"{family} on {backend}:", *(line for _, line in outcomes), sep="\n")  # -rP shows
    failures = [line for matched, line in outcomes if not matched]
    assert not failures, f"{family} on {backend}:\n" + "\n".join(failures)
    if condition := by_name(family).condition(backend):
        _check_refusal(conformance, family, backend, condition)


def _check_refusal(conformance: Kit, family: str, backend: str, condition: Condition) -> None:
    """The row's example, which the condition is about, is refused on the backend at
    start: exit status 2, no traceback, one last line naming the backend and condition."""
    conformance.close()  # one server at a time
    args = ["--model-id", str(conformance.path(family)), "--served-model-name", family]
    args += ["--backend", backend, "--device", "cpu", "--dtype", "float32"]
    args += ["--cache-dir", str(conformance.root / f"refused-{backend}")]
    with pytest.raises(RuntimeError, match="server exited with 2") as refused:
        with start_server(args):
            pass
    log = str(refused.value)
    assert "Traceback" not in log, log
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"ember: error: model {family!r} is a {family} model"), last
    assert f"--backend {backend} runs only with {condition.words}: {condition.why}" in last
    print(f"{family}'s example on {backend}: refused at start: {last}")


def _check(client: httpx.Client, family: str, probe: Probe) -> tuple[bool, str]:
    """Whether the answer matches, and a line naming the probe with its figure or error."""
    reply = client.post(probe.route, json={"model": family, **probe.body})
    if reply.status_code != 200:
        return False, f"  {probe.describe()}: HTTP {reply.status_code} {reply.text[:300]}"
    try:
        return True, f"  {probe.describe()}: {probe.compare(probe.read(reply.json()), probe.want)}"
    except AssertionError as error:
        return False, f"  {probe.describe()}: {error}"


def test_every_family_has_a_reference() -> None:
    references = modules()
    missing = [f.name for f in FAMILIES if module_name(f.name) not in references]
    assert not missing, (
        f"no conformance reference for {missing}: add tests/conformance/references/"
        f"{module_name(missing[0])}.py (tests/conformance/README.md)"
    )


def test_every_conditional_backend_has_a_variant() -> None:
    """A backend a row claims only on a condition is checked on a variant that meets it:
    the family's reference must build one (its ``VARIANTS``), never a skip."""
    references = modules()
    missing = [
        f"{f.name} on {c.backend} ({c.words})"
        for f in FAMILIES
        for c in f.conditions
        if module_name(f.name) in references
        and c.backend not in ELSEWHERE
        and not callable(getattr(references[module_name(f.name)], "VARIANTS", {}).get(c.backend))
    ]
    assert not missing, f"no reference variant for {missing}: add VARIANTS (README.md)"


def test_every_reference_is_a_registry_family() -> None:
    """Each module names a family of the registry, by its own file name, and mirrors the
    example that family's row names."""
    names = {f.name for f in FAMILIES}
    for name, module in modules().items():
        family = getattr(module, "FAMILY", None)
        assert family in names, f"references/{name}.py names no registry family ({family!r})"
        assert module_name(family) == name, f"references/{name}.py is {family}'s: rename it"
        example = by_name(family).example
        assert module.EXAMPLE == example, (
            f"references/{name}.py mirrors {module.EXAMPLE!r}; {family}'s row names {example!r}"
        )
        assert callable(module.build) and callable(module.probes), name
