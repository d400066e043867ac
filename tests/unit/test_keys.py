"""API keys (``ember.api.keys``): the file, the buckets, admission and reload, on a fake
clock; the served behaviour is in tests/integration/test_api_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.api.keys import KeyStore, hash_command, hash_key
from ember.api.limits import TokenBucket, retry_after
from ember.errors import ConfigError, Forbidden, RateLimited, Unauthorized
from ember.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, *entries: str) -> Path:
    path.write_text("\n".join(f"[[keys]]\n{e}" for e in entries))
    return path


def _bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


def test_bucket_takes_refills_and_charges_into_debt() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, stamp=0.0)
    assert [bucket.take(1, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(1, 0.0) == pytest.approx(0.5)  # refused: half a second to refill one
    assert bucket.take(1, 0.5) == 0.0
    bucket.charge(5, 0.5)  # after the fact: 0 - 5
    assert bucket.wait(0.5) == pytest.approx(2.5)
    assert bucket.wait(3.0) == 0.0
    assert bucket.take(1, 100.0) == 0.0 and bucket.level == pytest.approx(2.0)  # capped
    assert (retry_after(0.01), retry_after(2.5)) == (1, 3)


def test_hash_is_sha256_hex_of_the_key() -> None:
    assert hash_key("abc") == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert hash_command("abc\n") == f'hash = "{hash_key("abc")}"'
    with pytest.raises(ConfigError):
        hash_command("\n")


@pytest.mark.parametrize(
    "text, words",
    [
        ('name = "a"\nhash = "abc"', "hash"),
        (f'name = "a"\nhash = "{hash_key("k")}"\nrequests_per_second = 0', "requests_per_second"),
        (f'name = "a"\nhash = "{hash_key("k")}"\nrate = 1', "rate"),
        (
            f'name = "a"\nhash = "{hash_key("k")}"\n[[keys]]\nname = "a"\nhash = "{hash_key("j")}"',
            "same name a",
        ),
        ("name = [", "not valid TOML"),
    ],
)
def test_a_bad_file_refuses_to_start_saying_why(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path / "keys.toml", text)
    with pytest.raises(ConfigError, match=words):
        KeyStore(Metrics(), path=path)


def test_find_admit_and_limits(tmp_path: Path) -> None:
    clock = Clock()
    path = _write(
        tmp_path / "keys.toml",
        f'name = "a"\nhash = "{hash_key("ka")}"\nrequests_per_second = 1\nrequests_burst = 2\n'
        'routes = ["/v1/embeddings"]\nmodels = ["minilm"]',
        f'name = "b"\nhash = "{hash_key("kb")}"\nmax_concurrent = 1\ninputs_per_second = 10',
        f'name = "ops"\nhash = "{hash_key("ko")}"\nadmin = true',
    )
    store = KeyStore(Metrics(), path=path, plain_key="plain", clock=clock)
    for bad in ([], _bearer("nope"), [(b"authorization", b"Basic ka")]):
        with pytest.raises(Unauthorized):
            store.find(bad)
    a, b = store.find(_bearer("ka")), store.find(_bearer("kb"))
    assert store.find(_bearer("plain")).name == "--api-key"
    with pytest.raises(Forbidden, match="/v1/rerank"):
        a.admit("/v1/rerank")
    with pytest.raises(Forbidden, match="admin"):
        a.admit("/admin/usage")
    store.find(_bearer("ko")).admit("/admin/usage")
    with pytest.raises(Forbidden, match="'bge'"):
        a.check_model("bge")
    a.check_model("minilm")
    assert a.may_use("minilm") and not a.may_use("bge")  # what its model listings show
    assert b.may_use("bge")  # no model list: every model
    a.admit("/v1/embeddings")
    a.admit("/v1/embeddings")
    with pytest.raises(RateLimited, match="requests_per_second") as refused:
        a.admit("/v1/embeddings")
    assert refused.value.retry_after == 1
    clock.now += 1.0
    a.admit("/v1/embeddings")
    b.admit("/v1/x")
    with pytest.raises(RateLimited, match="max_concurrent"):
        b.admit("/v1/x")
    b.charge(25, 300)  # 10 - 25: 1.5 s of debt
    b.finish(200, admitted=True)
    with pytest.raises(RateLimited, match="inputs_per_second") as refused:
        b.admit("/v1/x")
    assert refused.value.retry_after == 2
    b.finish(429, admitted=False)
    assert store.report().keys["b"].model_dump() == {
        "requests": 2,
        "inputs": 25,
        "tokens": 300,
        "statuses": {"200": 1, "429": 1},
        "errors": {"429": 1},
        "in_flight": 0,
        "active": True,
    }


def test_reload_swaps_the_table_and_keeps_unchanged_keys(tmp_path: Path) -> None:
    clock = Clock()
    first = f'name = "a"\nhash = "{hash_key("ka")}"\nrequests_per_second = 1'
    path = _write(tmp_path / "keys.toml", first)
    store = KeyStore(Metrics(), path=path, plain_key="plain", clock=clock)
    a, plain = store.find(_bearer("ka")), store.find(_bearer("plain"))
    a.admit("/v1/embeddings")  # in flight across the reload
    _write(path, first, f'name = "c"\nhash = "{hash_key("kc")}"')
    store.poll()  # within POLL_SECONDS of the last look: no stat yet
    with pytest.raises(Unauthorized):
        store.find(_bearer("kc"))
    clock.now += 1.0
    store.poll()
    assert store.find(_bearer("kc")).name == "c"
    assert store.find(_bearer("ka")) is a  # unchanged: same buckets
    assert store.find(_bearer("plain")) is plain
    path.write_text("[[keys]\n")  # a bad edit: the keys in force stay
    assert not store.reload() and store.find(_bearer("kc")).name == "c"
    _write(path, f'name = "c"\nhash = "{hash_key("kc")}"')
    assert store.reload()
    with pytest.raises(Unauthorized):
        store.find(_bearer("ka"))
    a.finish(200, admitted=True)  # the revoked key's request still finishes and counts
    report = store.report().keys
    assert report["a"].active is False and report["a"].statuses == {"200": 1}
    assert report["a"].in_flight == 0


def test_the_plain_key_in_the_file_takes_the_file_entry(tmp_path: Path) -> None:
    path = _write(tmp_path / "keys.toml", f'name = "named"\nhash = "{hash_key("k")}"')
    store = KeyStore(Metrics(), path=path, plain_key="k")
    assert [key.name for key in store.table.values()] == ["named"]


def test_ember_keys_hash_reads_the_key_on_stdin(monkeypatch, capsys) -> None:
    import io

    from ember.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("sk-team-a\n"))
    assert main(["keys", "hash"]) == 0
    assert capsys.readouterr().out == f'hash = "{hash_key("sk-team-a")}"\n'
