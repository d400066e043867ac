"""Embed a whole corpus on Modal: split it into shards, ``.map`` them over GPU containers,
write one Parquet dataset, all on a ``modal.Volume``.

    modal run platforms/modal/corpus.py --input corpus.jsonl --output corpus-vectors \\
        --id-column id --shard-rows 100000
    modal volume get ember-corpus corpus-vectors ./corpus-vectors

The local entrypoint uploads the input to the Volume (skipped when ``--input`` names a
file already there, ``vol:inputs/corpus.jsonl``) and calls ``embed_corpus`` remotely,
which splits the input into Parquet shard files, maps ``CorpusWorker.embed_shard`` over
them (each a resumable ``ember embed`` job of its own, on the same engine and batcher),
and joins their outputs into ``--output``: the layout and checkpoint ``ember embed``
writes on one machine. Run it again after a failure and only unfinished shards run.

The model and its settings are the ``EMBER_*`` variables set when running, as for
``platforms/modal/app.py``; knobs of this file are ``EMBER_MODAL_*``:

==============================  ==============  ==========================================
variable                        default         meaning
==============================  ==============  ==========================================
EMBER_MODAL_CORPUS_VOLUME       ember-corpus    the Volume holding inputs, shards, outputs
EMBER_MODAL_GPU                 L4              GPU type of the workers
EMBER_MODAL_MAX_CONTAINERS      10              workers at once (shards beyond wait)
EMBER_MODAL_SHARD_TIMEOUT       3600            seconds one shard may take
==============================  ==============  ==========================================
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import modal

from ember.platform import (
    EngineLoop,
    InputSpec,
    JobOptions,
    ShardTask,
    build_engines,
    ember_env,
    env_int,
    fan_out,
    job_identity,
    job_settings,
    join_shards,
    plan_shards,
    read_pins,
    run_shard,
    settings_from_env,
)

PYTHON_VERSION = "3.11"
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
BAKE_SCRIPT = Path(__file__).resolve().parents[1] / "bake.py"
BAKE_PATH = "/opt/ember/bake.py"
DATA = Path("/corpus")  # where the Volume is mounted in every container
HF_HOME = "/models/hf"
GPU = os.environ.get("EMBER_MODAL_GPU", "L4")
# The model's settings reach the containers; the API key does not (a job serves nobody).
MODEL_ENV = {
    k: v for k, v in sorted(os.environ.items()) if k.startswith("EMBER_") and k != "EMBER_API_KEY"
}


def build_image() -> modal.Image:
    """As ``app.py``'s image: debian_slim and the pinned torch wheel (its own CUDA
    libraries), the weights baked by ``platforms/bake.py`` in a layer whose only inputs are
    the model ids and revisions, and Ember's source last, mounted at container start, so a
    code edit rebuilds nothing."""
    image = modal.Image.debian_slim(python_version=PYTHON_VERSION)
    if modal.is_local():  # the pins file exists only where the job is started from
        pins = read_pins("modal", CONSTRAINTS) + read_pins("modal-corpus", CONSTRAINTS)
        image = image.uv_pip_install(*pins)
    image = image.env({"HF_HOME": HF_HOME, "TOKENIZERS_PARALLELISM": "false"})
    given = ember_env(MODEL_ENV)
    if ids := given.get("model_id"):  # none: the packaged all-MiniLM-L6-v2 is used
        revisions = given.get("revision", "")
        image = (
            image.add_local_file(str(BAKE_SCRIPT), BAKE_PATH, copy=True)
            .run_commands(f"python {BAKE_PATH} {shlex.quote(ids)} {shlex.quote(revisions)}")
            .env({"HF_HUB_OFFLINE": "1"})
        )
    return image.add_local_python_source("ember")


volume = modal.Volume.from_name(
    os.environ.get("EMBER_MODAL_CORPUS_VOLUME", "ember-corpus"), create_if_missing=True
)
app = modal.App("ember-corpus", image=build_image())


def _sync(action: Callable[[], object]) -> None:
    """Volume commit/reload in a container; nothing to share when run in this process."""
    if not modal.is_local():
        action()


def job_options(output: Path, options: dict[str, Any]) -> JobOptions:
    """JobOptions from the plain dict that travels to the containers."""
    return JobOptions(output=output, progress=False, **options)


@app.cls(
    gpu=GPU,
    env=MODEL_ENV,
    volumes={str(DATA): volume},
    max_containers=env_int("EMBER_MODAL_MAX_CONTAINERS", 10),
    timeout=env_int("EMBER_MODAL_SHARD_TIMEOUT", 3600),
)
class CorpusWorker:
    """One GPU container: the model loaded once, then shard after shard."""

    @modal.enter()
    def load(self) -> None:
        self.loop = EngineLoop()
        settings = job_settings(settings_from_env(), JobOptions(output=DATA))
        self.engines = self.loop.run(build_engines(settings))

    @modal.exit()
    def unload(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engines and their loop (the exit hook; tests call it after `.local()`)."""
        self.loop.run(self.engines.stop())
        self.loop.close()

    @modal.method()
    def embed_shard(self, work: str, task: dict[str, Any], options: dict[str, Any]) -> dict:
        """Embed one shard into its own small dataset under ``work`` (an absolute path:
        the Volume is mounted at the same place in every container)."""
        _sync(volume.reload)  # see the inputs the planner committed
        shard = ShardTask(**task)
        engine = self.engines.get(None)
        summary = self.loop.run(
            run_shard(engine, Path(work), shard, job_options(Path(work), options))
        )
        _sync(volume.commit)
        return {"shard": shard.index, "rows": summary.rows, "seconds": summary.seconds}


def run_corpus(
    root: Path,
    input: str,
    output: str,
    *,
    map_shards: Callable[[list[ShardTask], str], Iterable[Any]],
    text_column: str = "text",
    id_column: str | None = None,
    shard_rows: int = 100_000,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Plan, fan out and join under ``root`` (the Volume's mount, or any directory):
    ``map_shards(tasks, work)`` runs the shards somewhere and returns when they are done
    (``work``: the absolute path of the shards' directory)."""
    options = options or {}
    source = InputSpec.of(root / input, text_column=text_column, id_column=id_column)
    work = root / f"{output}.work"
    tasks = plan_shards(source, work, shard_rows)
    _sync(volume.commit)  # workers read the shard inputs
    ran = fan_out(tasks, work, lambda pending: map_shards(pending, str(work)))
    _sync(volume.reload)  # ... and the driver reads what they wrote
    spec = settings_from_env().model_specs()[0]
    job = {
        **job_identity(spec, source, options.get("output_kind"), job_options(root, options)),
        "shard_rows": shard_rows,
    }
    checkpoint = join_shards(work, tasks, root / output, job)
    _sync(volume.commit)
    return {
        "output": output,
        "rows": checkpoint.rows_done,
        "shards": len(tasks),
        "shards_run": len(ran),
    }


@app.function(volumes={str(DATA): volume}, env=MODEL_ENV, timeout=24 * 3600)
def embed_corpus(
    input: str,
    output: str,
    text_column: str = "text",
    id_column: str | None = None,
    shard_rows: int = 100_000,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The driver, in a CPU container beside the Volume: workers are mapped from here."""
    worker = CorpusWorker()

    def map_shards(tasks: list[ShardTask], work: str) -> Iterable[Any]:
        plain = [asdict(t) for t in tasks]
        return worker.embed_shard.map(
            [work] * len(tasks), plain, [options or {}] * len(tasks), order_outputs=False
        )

    return run_corpus(
        DATA,
        input,
        output,
        map_shards=map_shards,
        text_column=text_column,
        id_column=id_column,
        shard_rows=shard_rows,
        options=options,
    )


@app.local_entrypoint()
def main(
    input: str,
    output: str,
    text_column: str = "text",
    id_column: str = "",
    shard_rows: int = 100_000,
    output_kind: str = "",
) -> None:
    """Upload ``input`` (unless it is ``vol:<path on the Volume>``) and run the job."""
    if input.startswith("vol:"):
        remote = input.removeprefix("vol:").lstrip("/")
    else:
        remote = f"inputs/{Path(input).name}"
        with volume.batch_upload(force=True) as batch:
            batch.put_file(input, f"/{remote}")
    summary = embed_corpus.remote(
        remote,
        output,
        text_column=text_column,
        id_column=id_column or None,
        shard_rows=shard_rows,
        options={"output_kind": output_kind or None},
    )
    print(summary)
