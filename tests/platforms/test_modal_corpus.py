"""The Modal corpus fan-out, run here with ``.local()``: the real module and ``modal``
client, the worker class's enter hook, the planner splitting a corpus into shards, each
shard embedded by ``CorpusWorker.embed_shard``, and the join into one dataset, equal row for
row to what ``ember embed`` writes on one machine. Modal's cloud (GPUs, the Volume, the
``.map`` itself) is not reached; docs/platforms/modal.md says how to run it there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.platforms._helpers_modal_bentoml import (
    REMOVED_MODAL_ARGS,
    REPO,
    child_env,
    keyword_arguments,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:The CorpusWorker.embed_shard function is executing locally"  # no Volume here: fine
)
CORPUS = REPO / "platforms" / "modal" / "corpus.py"
ROWS = 230
SHARD_ROWS = 50


@pytest.fixture()
def modal_env(minilm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "EMBER_MODEL_ID", "EMBER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMBER_MODEL_ID", str(minilm_path))
    monkeypatch.setenv("EMBER_BACKEND", "torch")
    monkeypatch.setenv("EMBER_DEVICE", "cpu")


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    words = "shards map over containers and join into one dataset".split()
    with (tmp_path / "corpus.jsonl").open("w") as fh:
        for i in range(ROWS):
            text = " ".join(rng.choice(words, size=int(rng.integers(3, 40))))
            fh.write(json.dumps({"key": 1000 + i, "text": f"{i} {text}"}) + "\n")
    return tmp_path


@pytest.fixture()
def worker(modal_env: None) -> Iterator[Any]:
    from platforms.modal.corpus import CorpusWorker

    worker = CorpusWorker()
    yield worker
    # Modal runs no exit hook for `.local()` (a container would run it at scale-down): run
    # it on the instance `.local()` built, so the engines and their loop stop here.
    instance = worker._cached_user_cls_instance()  # what `.local()` calls ran on
    if hasattr(instance, "engines"):
        instance.close()


def test_source_uses_no_removed_modal_arguments() -> None:
    used = keyword_arguments(CORPUS)
    assert not used & REMOVED_MODAL_ARGS, sorted(used & REMOVED_MODAL_ARGS)
    assert {"max_containers", "order_outputs", "volumes"} <= used


def test_imports_without_credentials_and_keeps_the_api_key_out(tmp_path: Path) -> None:
    """`modal run` imports the module where the job starts: no token needed, the model's
    settings forwarded to the workers, the API key not (a job serves nobody)."""
    code = (
        "import modal, platforms.modal.corpus as c\n"
        "assert isinstance(c.CorpusWorker, modal.Cls)\n"
        "print(c.app.name, sorted(c.MODEL_ENV))\n"
    )
    env = child_env({"EMBER_MODEL_ID": "BAAI/bge-small-en-v1.5", "EMBER_API_KEY": "k"}, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["ember-corpus", "['EMBER_MODEL_ID']\n"]


@pytest.mark.slow
def test_local_shards_join_into_the_single_machine_dataset(
    corpus: Path, worker: Any, minilm_path: Path
) -> None:
    from ember.config import settings_from_env
    from ember.jobs.inputs import InputSpec
    from ember.jobs.runner import JobOptions, embed_corpus
    from platforms.modal.corpus import run_corpus

    calls: list[list[int]] = []
    fail_once = {3}

    def map_shards(tasks: list[Any], work: str) -> list[dict]:
        """Modal's .map, here: each shard through the worker's own method, in any order;
        shard 3 fails the first time, as a preempted container would."""
        calls.append([t.index for t in tasks])
        done = []
        for task in reversed(tasks):
            if task.index in fail_once:
                fail_once.discard(task.index)
                continue
            done.append(worker.embed_shard.local(work, asdict(task), {}))
        return done

    from ember.errors import ConfigError

    with pytest.raises(ConfigError, match=r"shards \[3\] did not finish"):
        run_corpus(corpus, "corpus.jsonl", "out", map_shards=map_shards, id_column="key",
                   shard_rows=SHARD_ROWS)  # fmt: skip
    summary = run_corpus(
        corpus, "corpus.jsonl", "out", map_shards=map_shards, id_column="key",
        shard_rows=SHARD_ROWS,
    )  # fmt: skip
    assert calls == [[0, 1, 2, 3, 4], [3]]  # the rerun runs only the shard that failed
    assert summary == {"output": "out", "rows": ROWS, "shards": 5, "shards_run": 1}

    fanned = pq.read_table(corpus / "out")
    assert fanned.column("id").to_pylist() == [1000 + i for i in range(ROWS)]
    checkpoint = json.loads((corpus / "out" / "_ember_job.json").read_text())
    assert checkpoint["complete"] and checkpoint["total_rows"] == ROWS
    assert [s["start"] for s in checkpoint["shards"]] == list(range(0, ROWS, SHARD_ROWS))

    local = embed_corpus(
        settings_from_env(model_id=str(minilm_path), backend="torch", device="cpu"),
        InputSpec.of(corpus / "corpus.jsonl", id_column="key"),
        JobOptions(output=corpus / "single", progress=False),
    )
    assert local.rows == ROWS
    single = pq.read_table(corpus / "single")
    assert single.schema == fanned.schema
    got = np.asarray(fanned.column("embedding").to_pylist(), dtype=np.float32)
    want = np.asarray(single.column("embedding").to_pylist(), dtype=np.float32)
    assert np.abs(got - want).max() < 1e-5

    again = run_corpus(corpus, "corpus.jsonl", "out", map_shards=map_shards, id_column="key",
                       shard_rows=SHARD_ROWS)  # fmt: skip
    assert again["shards_run"] == 0 and calls[-1] == []  # done: nothing mapped again
