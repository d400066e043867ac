"""Schemathesis against the served OpenAPI schema: every operation, positive and negative cases.

Driven without schemathesis' pytest plugin (it does not run under pytest 9.2): the schema is
loaded from the session's real server on 127.0.0.1, each operation's strategy is run through
plain ``hypothesis.given`` with a fixed seed and a small example count, and every failing
check is collected so one run reports them all.
"""

from __future__ import annotations

import time
from collections import Counter

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support import ServerProcess

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES = 100  # per operation and mode: 21 operations, ~3,300 calls, ~25 s on 2 cores
BUDGET_S = 300  # a run past this fails (it never skips what is left)


def test_schema_holds(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.headers)
    failures: list[str] = []
    ran = 0
    statuses: Counter[int] = Counter()
    started = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        modes = [GenerationMode.POSITIVE]
        if len(op.body) or any(True for _ in op.iter_parameters()):
            modes.append(GenerationMode.NEGATIVE)  # GETs without inputs have nothing to break
        for mode in modes:
            if time.monotonic() - started > BUDGET_S:
                failures.append(f"over the {BUDGET_S} s budget before {op.path} [{mode.value}]")
                break

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,  # a fixed seed: the same cases every run
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: report, don't minimise
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case) -> None:
                response = case.call(headers=server.headers, timeout=30)
                statuses[response.status_code] += 1
                case.validate_response(response, checks=CHECKS, headers=server.headers)

            try:
                run()
            # FailureGroup is a BaseExceptionGroup: collect it too, so every operation is reported
            except (Exception, FailureGroup) as exc:
                failures.append(f"{op.method.upper()} {op.path} [{mode.value}]:\n{exc}")
            ran += 1
    elapsed = time.monotonic() - started
    assert ran >= 2, "the schema has no operations"
    assert statuses[200] >= 100, f"too few cases reached a model: {dict(statuses)}"
    assert not failures, f"{len(failures)} of {ran} runs failed ({elapsed:.0f} s):\n\n" + (
        "\n\n".join(failures)
    )
