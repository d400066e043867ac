"""Several API keys on a real `ember serve` (``--api-keys-file``): each key limited alone,
usage equal to what each client sent, a model or route a key may not use, the admin route,
and reloads that add and revoke keys without a restart or a dropped request.

One server for the module (MiniLM); floods bounded in count and time. The model listings of
a key limited to one of several models use the session's ``cache_server`` (four models).
The latency of the steady client under a flood is benchmarks/api_keys.py's, not asserted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.api_keys import BODY, FLOOD_KEY, STEADY_KEY, bearer, flood, keys_toml, steady
from ember.api.keys import hash_key
from tests.conftest import API_KEY, MINILM_B_KEY
from tests.support import ServerProcess, start_server

OTHER_MODEL, ADMIN, LATE = "sk-other-model", "sk-ops", "sk-late"
INDEXER, APP = "sk-indexer", "sk-app"  # a bulk key (its ceiling), an interactive one
MORE_KEYS = (
    f'[[keys]]\nname = "other-model"\nhash = "{hash_key(OTHER_MODEL)}"\n'
    'models = ["bge"]\nroutes = ["/v1/embeddings", "/tokenize", "/v1/models", "/info"]\n'
    f'[[keys]]\nname = "ops"\nhash = "{hash_key(ADMIN)}"\nadmin = true\n'
    f'[[keys]]\nname = "indexer"\nhash = "{hash_key(INDEXER)}"\n'
    'priority = "bulk"\npriority_ceiling = "bulk"\n'
    f'[[keys]]\nname = "app"\nhash = "{hash_key(APP)}"\npriority = "interactive"\n'
)


def _write(path: Path, text: str) -> None:
    """As an operator should: a new file renamed over the old (no half-written read)."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, minilm_path: Path
) -> Iterator[tuple[ServerProcess, Path]]:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    _write(path, keys_toml(flood_rps=5, steady_rps=40) + MORE_KEYS)
    args = [
        "--model-id",
        str(minilm_path),
        "--served-model-name",
        "minilm",
        "--api-keys-file",
        str(path),
    ]
    with start_server(args) as server:
        yield server, path


def _usage(server: ServerProcess) -> dict:
    answer = httpx.get(server.url + "/admin/usage", headers=bearer(ADMIN), timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["keys"]


def _metric(server: ServerProcess, line_start: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start)]
    return float(found[0]) if found else 0.0


def test_one_key_flooding_is_refused_alone_and_usage_counts_what_each_sent(keyed) -> None:
    server, _ = keyed

    async def both() -> tuple:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(
                flood(client, FLOOD_KEY, requests=60, concurrency=8, seconds=10.0),
                steady(client, STEADY_KEY, requests=10, rate=10.0),
            )

    flood_statuses, (_, steady_statuses) = asyncio.run(both())
    assert flood_statuses[429] > 0 and flood_statuses[200] > 0, flood_statuses
    assert set(flood_statuses) == {200, 429}
    assert dict(steady_statuses) == {200: 10}

    def probe() -> httpx.Response:
        return httpx.post(server.url + "/v1/embeddings", json=BODY, headers=bearer(FLOOD_KEY))

    refused, probes_ok = probe(), 0
    while refused.status_code == 200 and probes_ok < 20:  # refilled meanwhile: spend it
        refused, probes_ok = probe(), probes_ok + 1
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "requests_per_second" in error["message"]
    assert "'flood'" in error["message"]

    usage = _usage(server)
    sent = sum(flood_statuses.values())
    flood_usage = usage["flood"]
    # what the client saw, plus the probes above (all but the last answered 200)
    assert flood_usage["requests"] == sent + probes_ok + 1
    assert flood_usage["statuses"]["200"] == flood_statuses[200] + probes_ok
    assert flood_usage["statuses"]["429"] == flood_statuses[429] + 1
    assert flood_usage["inputs"] == flood_statuses[200] + probes_ok  # one text each
    assert flood_usage["errors"] == {"429": flood_statuses[429] + 1}
    assert usage["steady"]["requests"] == 10 and usage["steady"]["inputs"] == 10
    assert usage["steady"]["statuses"] == {"200": 10} and usage["steady"]["tokens"] == 10 * 6
    assert _metric(server, 'ember_key_requests_total{key="steady",status="200"}') == 10
    assert _metric(server, 'ember_key_inputs_total{key="steady"}') == 10
    assert _metric(server, 'ember_key_rate_limited_total{key="flood",limit="requests_per_') > 0


def test_a_key_gets_403_for_a_model_or_route_it_may_not_use(keyed) -> None:
    server, _ = keyed
    headers = bearer(OTHER_MODEL)
    # one model served: any `model` names it (as on Infinity and TEI), and this key may
    # use only "bge"
    for body in (BODY, {**BODY, "model": "bge"}, {"input": "a fox"}):
        other = httpx.post(server.url + "/v1/embeddings", json=body, headers=headers)
        assert other.status_code == 403, other.text
        assert other.json()["error"]["type"] == "permission_error"
        assert "'minilm'" in other.json()["error"]["message"]
    allowed = httpx.post(server.url + "/v1/embeddings", json=BODY, headers=bearer(STEADY_KEY))
    assert allowed.status_code == 200
    # a route outside its list: refused before the body is read (not even parsed)
    route = httpx.post(server.url + "/v1/rerank", content=b"{not json", headers=headers)
    assert route.status_code == 403 and "/v1/rerank" in route.json()["error"]["message"]
    for key in (OTHER_MODEL, STEADY_KEY):  # no admin flag
        assert httpx.get(server.url + "/admin/usage", headers=bearer(key)).status_code == 403
    assert httpx.get(server.url + "/admin/usage").status_code == 401
    usage = _usage(server)["other-model"]
    assert usage["statuses"] == {"403": 5} and usage["inputs"] == 0


def test_a_keys_lane_ceiling_caps_its_claims_and_the_served_tier_is_echoed(keyed) -> None:
    """Lanes (docs/operations/lanes.md): a bulk key claiming the interactive lane is served bulk, by
    the body (OpenAI's service_tier, vLLM's priority) or the header; the tier is echoed
    in OpenAI's answer and the lane in X-Ember-Priority on every route."""
    server, _ = keyed

    def post(key: str, path: str, body: dict, **headers: str) -> httpx.Response:
        answer = httpx.post(server.url + path, json=body, headers={**bearer(key), **headers})
        assert answer.status_code == 200, answer.text
        return answer

    cases = [  # key, extra body fields, header, served tier
        (INDEXER, {"service_tier": "priority"}, {}, "flex"),
        (INDEXER, {"priority": -1}, {}, "flex"),
        (INDEXER, {}, {"X-Ember-Priority": "interactive"}, "flex"),
        (APP, {}, {}, "priority"),  # the key's default
        (APP, {"priority": 5}, {}, "flex"),  # a later lane may always be claimed
        (APP, {"service_tier": "auto"}, {"X-Ember-Priority": "bulk"}, "default"),  # body first
        (APP, {}, {"X-Ember-Priority": "flex"}, "flex"),
    ]
    lanes = {"priority": "interactive", "default": "default", "flex": "bulk"}
    for key, fields, headers, tier in cases:
        answer = post(key, "/v1/embeddings", {**BODY, **fields}, **headers)
        assert answer.json()["service_tier"] == tier, (key, fields, headers)
        assert answer.headers["x-ember-priority"] == lanes[tier]
    tei = post(INDEXER, "/embed", {"inputs": "a fox", "priority": -1})
    assert tei.headers["x-ember-priority"] == "bulk"
    score = {"text_1": "a fox", "text_2": "a dog", "priority": -5}  # vLLM's, cosine here
    assert post(INDEXER, "/score", score).headers["x-ember-priority"] == "bulk"
    assert post(APP, "/score", score).headers["x-ember-priority"] == "interactive"
    bad = httpx.post(
        server.url + "/v1/embeddings",
        json=BODY,
        headers={**bearer(APP), "X-Ember-Priority": "soon"},
    )
    assert bad.status_code == 400 and "X-Ember-Priority" in bad.text
    bulk = _metric(server, 'ember_lane_tokens_total{lane="bulk",model="minilm"}')
    assert bulk >= 7 * 5  # seven bulk answers above, five tokens or more each


def test_a_key_limited_to_one_model_lists_only_that_one(cache_server: ServerProcess) -> None:
    def listed(key: str) -> tuple[list[str], dict]:
        models = httpx.get(cache_server.url + "/v1/models", headers=bearer(key), timeout=10)
        infinity = httpx.get(cache_server.url + "/models", headers=bearer(key), timeout=10)
        info = httpx.get(cache_server.url + "/info", headers=bearer(key), timeout=10)
        assert models.status_code == infinity.status_code == info.status_code == 200
        names = [m["id"] for m in models.json()["data"]]
        assert [m["id"] for m in infinity.json()["data"]] == names
        return names, info.json()

    every, every_info = listed(API_KEY)  # --api-key: no model list, sees all
    assert every == ["minilm", "minilm-b", "splade", "colbert"] == every_info["models"]
    assert every_info["model_id"] == "minilm"
    one, one_info = listed(MINILM_B_KEY)
    assert one == ["minilm-b"] == one_info["models"]
    assert one_info["model_id"] == "minilm-b" and one_info["dimensions"] == 384
    # an error that names the served models names only the ones this key may use
    unknown = httpx.post(
        cache_server.url + "/v1/embeddings",
        json={"model": "nope", "input": "a"},
        headers=bearer(MINILM_B_KEY),
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"].endswith("served models: minilm-b")
    # no `model`: the one this key may use (several served); the --api-key key must name one
    for key, status, served in ((MINILM_B_KEY, 200, "minilm-b"), (API_KEY, 400, None)):
        unnamed = httpx.post(
            cache_server.url + "/v1/embeddings", json={"input": "a"}, headers=bearer(key)
        )
        assert unnamed.status_code == status, unnamed.text
        if served:
            assert unnamed.json()["model"] == served
        else:
            assert "several models are served" in unnamed.json()["error"]["message"]


def test_a_key_whose_models_are_not_served_lists_none(keyed) -> None:
    server, _ = keyed
    models = httpx.get(server.url + "/v1/models", headers=bearer(OTHER_MODEL), timeout=10)
    assert models.status_code == 200 and models.json()["data"] == []
    info = httpx.get(server.url + "/info", headers=bearer(OTHER_MODEL), timeout=10)
    assert info.status_code == 403 and info.json()["error"]["type"] == "permission_error"
    assert "none of the served models" in info.json()["error"]["message"]
    steady = httpx.get(server.url + "/v1/models", headers=bearer(STEADY_KEY), timeout=10)
    assert [m["id"] for m in steady.json()["data"]] == ["minilm"]


def test_reload_adds_and_revokes_keys_without_dropping_requests_in_flight(keyed) -> None:
    server, path = keyed
    late = httpx.post(server.url + "/v1/embeddings", json=BODY, headers=bearer(LATE))
    assert late.status_code == 401
    big = {"model": "minilm", "input": [f"sentence {i} " * 20 for i in range(16)]}
    with httpx.Client(base_url=server.url, timeout=60) as client:

        def send() -> int:
            return client.post("/v1/embeddings", json=big, headers=bearer(STEADY_KEY)).status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(send) for _ in range(4)]
            deadline = time.monotonic() + 30
            while _usage(server)["steady"]["in_flight"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            in_flight = _usage(server)["steady"]["in_flight"]
            # revoke `steady` (and add `late`): SIGHUP reloads at once
            revoked = keys_toml(5, 40).split("[[keys]]")[1]  # the flood key only
            _write(
                path,
                f"[[keys]]{revoked}"
                + MORE_KEYS
                + (f'[[keys]]\nname = "late"\nhash = "{hash_key(LATE)}"\n'),
            )
            server.process.send_signal(signal.SIGHUP)
            statuses = [f.result(timeout=60) for f in pending]
    assert in_flight > 0 and statuses == [200] * 4
    after = httpx.post(server.url + "/v1/embeddings", json=BODY, headers=bearer(LATE))
    assert after.status_code == 200, after.text
    gone = httpx.post(server.url + "/v1/embeddings", json=BODY, headers=bearer(STEADY_KEY))
    assert gone.status_code == 401
    usage = _usage(server)
    assert usage["steady"]["active"] is False and usage["steady"]["in_flight"] == 0
    assert usage["late"]["active"] is True

    # the file's change alone (mtime, polled at most once a second) revokes `late` too
    _write(path, f"[[keys]]{revoked}" + MORE_KEYS)
    deadline = time.monotonic() + 10
    status = 200
    while status != 401 and time.monotonic() < deadline:
        time.sleep(0.3)
        status = httpx.post(
            server.url + "/v1/embeddings", json=BODY, headers=bearer(LATE)
        ).status_code
    assert status == 401
    assert server.process.poll() is None  # the same process throughout
