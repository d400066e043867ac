"""OpenTelemetry end to end: the SDK's OTLP/HTTP exporter in a real `ember serve` (and in
`ember embed`, and the platform adapters' dispatch) sends to an OTLP receiver started here on
127.0.0.1, and what arrives is one trace per request: the request span with its route,
model, status and request id, the stage spans under it, the client's trace continued."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.support import REPO, ServerProcess, child_env, start_server

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
STAGES = ["tokenize", "queue", "forward", "serialize"]
# The SDK's own variables: protocol, a short batch schedule, the service name.
OTEL_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
    "OTEL_SERVICE_NAME": "ember-under-test",
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced_server(minilm_path: Path, receiver: Receiver) -> Iterator[ServerProcess]:
    args = ["--model-id", str(minilm_path), "--served-model-name", "minilm", "--backend", "torch"]
    env = {**OTEL_ENV, "EMBER_OTLP_ENDPOINT": receiver.url}
    with start_server(args, env=env) as proc:
        yield proc


def _by_trace(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    traces: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def _request_span(spans: list[ReceivedSpan], request_id: str) -> ReceivedSpan:
    [span] = [s for s in spans if s.attributes.get("ember.request_id") == request_id]
    return span


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id}


def test_each_request_is_one_trace_with_its_stages(
    traced_server: ServerProcess, receiver: Receiver
) -> None:
    texts = {"model": "minilm", "input": ["tracing a request", "through every stage"]}
    with httpx.Client(base_url=traced_server.url, timeout=60) as client:
        unsampled = client.post(  # the client's trace is not sampled: parent-based, no span
            "/v1/embeddings",
            json=texts,
            headers={
                "traceparent": f"00-{'1' * 32}-{PARENT_ID}-00",
                "x-request-id": "not-sampled",
            },
        )
        continued = client.post(
            "/v1/embeddings",
            json=texts,
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "x-request-id": "continued"},
        )
        fresh = client.post("/embed", json={"inputs": "hi"}, headers={"x-request-id": "fresh"})
        refused = client.post(
            "/embed", json={"inputs": "hi", "dimensions": 9999}, headers={"x-request-id": "bad"}
        )
        health = client.get("/health")
    assert [r.status_code for r in (unsampled, continued, fresh, refused, health)] == [
        200,
        200,
        200,
        400,
        200,
    ]
    # Three request spans, stages under the two that ran: 3 + 2 x 4.
    spans = receiver.wait_for(lambda got: len(got) >= 11)
    assert len(spans) == 11, [(s.name, s.attributes) for s in spans]
    traces = _by_trace(spans)
    assert len(traces) == 3  # one per traced request, the unsampled one absent
    assert all(s.resource["service.name"] == "ember-under-test" for s in spans)

    root = _request_span(spans, "continued")
    assert root.trace_id == TRACE_ID and root.parent_span_id == PARENT_ID
    assert root.name == "POST /v1/embeddings"
    assert root.attributes["ember.route"] == "/v1/embeddings"
    assert root.attributes["ember.model"] == "minilm"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["ember.tokens"] == continued.json()["usage"]["prompt_tokens"]
    stages = _children(spans, root)
    assert sorted(stages) == sorted(STAGES)
    assert {s.trace_id for s in stages.values()} == {TRACE_ID}
    forward = stages["forward"].attributes
    assert 1 <= forward["ember.batch.size"] <= 2
    assert forward["ember.batch.tokens"] >= forward["ember.batch.size"]
    assert forward["ember.tokens"] == root.attributes["ember.tokens"]
    tokenize, queue, run = (stages[name] for name in STAGES[:3])  # one after the other
    assert (tokenize.end_ns, queue.end_ns) == (queue.start_ns, run.start_ns)

    new = _request_span(spans, "fresh")
    assert new.trace_id != TRACE_ID and new.parent_span_id == ""
    assert new.name == "POST /embed" and sorted(_children(spans, new)) == sorted(STAGES)

    bad = _request_span(spans, "bad")
    assert bad.attributes["http.response.status_code"] == 400
    assert _children(spans, bad) == {}  # refused before the engine ran
    assert not any(s.attributes.get("ember.request_id") == "not-sampled" for s in spans)


@pytest.fixture(scope="module")
def static_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny static model: the job and dispatch run on numpy, loading in well under 1 s."""
    from tests.fixtures.static_models import build_potion_like

    return build_potion_like(tmp_path_factory.mktemp("traced") / "potion")


def test_the_corpus_job_traces_each_chunk(
    tmp_path: Path, static_model: Path, receiver: Receiver
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(6)))
    before = len(receiver.spans)
    env = {**OTEL_ENV, "EMBER_OTLP_ENDPOINT": receiver.url}
    args = ["--output", str(tmp_path / "out"), "--chunk-rows", "2", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "ember", "embed", str(corpus), "--model-id", str(static_model)]
        + args,
        cwd=REPO,
        env=child_env(env, drop_prefixes=("EMBER_",)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    # The exporter flushed as the job exited: three chunks, each with its three stages.
    spans = receiver.wait_for(lambda got: len(got) >= before + 12, timeout=10)[before:]
    chunks = [s for s in spans if s.name == "ember embed"]
    assert len(chunks) == 3 and len(spans) == 12
    assert len(_by_trace(spans)) == 3
    for chunk in chunks:
        assert chunk.attributes["ember.model"] == str(static_model)
        assert chunk.attributes["http.response.status_code"] == 200
        assert sorted(_children(spans, chunk)) == ["forward", "queue", "tokenize"]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_adapters_dispatch_makes_the_same_spans(
    static_model: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dispatch_invocation`` under an adapter's own traced request (SageMaker's
    ``/invocations`` through the app) and alone (RunPod's handler, a batch file's line)."""
    from ember import tracing
    from ember.config import settings_from_env
    from ember.engine import EngineArray
    from ember.errors import NotFound
    from ember.platform import dispatch_invocation, dispatch_route

    tracer = tracing.Tracer(receiver.url, "http/protobuf")
    monkeypatch.setattr(tracing, "_tracer", tracer)
    engines = EngineArray(settings_from_env(model_id=str(static_model)).model_specs())
    await engines.start()
    before = len(receiver.spans)
    try:
        with tracing.request("POST /invocations", request_id="outer", server=True):
            await dispatch_invocation(engines, {"input": ["one", "two"]})
        await dispatch_route(engines, "/embed", {"inputs": "alone"})
        with pytest.raises(NotFound, match="no route"):
            await dispatch_route(engines, "/nowhere", {})
    finally:
        tracer.provider.shutdown()  # exports what it holds
        await engines.stop()
    spans = receiver.spans[before:]
    outer = _request_span(spans, "outer")
    [inner] = [s for s in spans if s.parent_span_id == outer.span_id]
    assert inner.name == "/v1/embeddings" and inner.trace_id == outer.trace_id
    assert sorted(_children(spans, inner)) == sorted(STAGES)
    [alone] = [s for s in spans if s.name == "/embed"]
    assert alone.parent_span_id == "" and sorted(_children(spans, alone)) == sorted(STAGES)
    assert alone.attributes["ember.model"] == str(static_model)
    assert len(spans) == 2 * 5 + 1  # an unknown route is refused before any span
