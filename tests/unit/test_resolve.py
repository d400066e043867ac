"""Model resolution reads the model's own files; nothing is guessed silently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ember.defaults import DEFAULT_MODEL_NAME
from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.facts import detect_task
from ember.models.spec import ModelSpec


def test_default_model_is_packaged_minilm() -> None:
    model = resolve_model(ModelSpec(model_id=""))
    assert model.served_name == DEFAULT_MODEL_NAME
    assert (model.task, model.pooling, model.normalize) == ("embed", "mean", True)
    assert (model.max_length, model.hidden_size) == (256, 384)
    assert resolve_model(ModelSpec(model_id=DEFAULT_MODEL_NAME)).path == model.path


@pytest.mark.parametrize(
    ("config", "task", "labels"),
    [
        ({"architectures": ["BertModel"]}, "embed", 0),
        ({"architectures": ["BertForSequenceClassification"], "num_labels": 1}, "rerank", 1),
        (
            {
                "architectures": ["XLMRobertaForSequenceClassification"],
                "id2label": {"0": "neg", "1": "pos"},
            },
            "classify",
            2,
        ),
        (
            {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}},
            "rerank",
            1,
        ),
    ],
)
def test_detect_task(config: dict, task: str, labels: int) -> None:
    detected, num_labels, _ = detect_task(config)
    assert (detected, num_labels) == (task, labels)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_prompts_and_pooling_override(minilm_path: Path, tmp_path: Path) -> None:
    root = _copy(minilm_path, tmp_path / "m")
    (root / "config_sentence_transformers.json").write_text(
        json.dumps(
            {
                "prompts": {"query": "query: ", "passage": "passage: "},
                "default_prompt_name": "query",
            }
        )
    )
    model = resolve_model(ModelSpec(model_id=str(root), pooling="cls"))
    assert model.prompts == {"query": "query: ", "passage": "passage: "}
    assert model.default_prompt_name == "query" and model.pooling == "cls"
    assert model.served_name == str(root)


def test_missing_pooling_config_is_an_error_not_a_default(
    minilm_path: Path, tmp_path: Path
) -> None:
    root = _copy(minilm_path, tmp_path / "m")
    (root / "modules.json").unlink()
    with pytest.raises(ConfigError, match="--pooling"):
        resolve_model(ModelSpec(model_id=str(root)))
    model = resolve_model(ModelSpec(model_id=str(root), pooling="mean"))
    assert model.normalize is False and model.max_length == 256


def test_task_override_needs_a_head(minilm_path: Path) -> None:
    with pytest.raises(ConfigError, match="ForSequenceClassification"):
        resolve_model(ModelSpec(model_id=str(minilm_path), task="rerank"))


def test_not_a_model_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(ModelSpec(model_id=str(tmp_path)))


def test_offline_hub_id_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        resolve_model(ModelSpec(model_id="someone/not-cached-model"))


def test_legacy_weights_are_fetched_only_where_no_safetensors_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub model saved before safetensors (only pytorch_model.bin) downloads its weights
    in a second pass; one with safetensors does not download its .bin twice."""
    import huggingface_hub

    from ember.models import resolve

    calls: list[list[str]] = []

    def snapshot(repo_id: str, *, allow_patterns: list[str], **_: object) -> str:
        calls.append(allow_patterns)
        root = tmp_path / repo_id
        (root / "1_Pooling").mkdir(parents=True, exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text('{"pooling_mode": "mean"}')
        (root / "config.json").write_text('{"model_type": "bert"}')
        if repo_id == "new":
            (root / "model.safetensors").write_bytes(b"")
        return str(root)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    resolve._download("new", None)
    assert calls == [resolve.HUB_PATTERNS]
    calls.clear()
    resolve._download("old", None)
    assert calls == [resolve.HUB_PATTERNS, resolve.LEGACY_WEIGHT_PATTERNS]
    assert resolve.needs_legacy_weights(tmp_path / "old")
    assert not resolve.needs_legacy_weights(tmp_path / "new")


def test_a_torch_free_install_fetches_the_openvino_ir_only_where_no_onnx_graph_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch, a hub repo with no ONNX graph fetches its OpenVINO IR (the one graph
    such an install can serve); with a graph, or with torch to export one, it does not."""
    import huggingface_hub

    import ember.installed
    from ember.models import resolve

    calls: list[list[str]] = []

    def snapshot(repo_id: str, *, allow_patterns: list[str], **_: object) -> str:
        calls.append(allow_patterns)
        root = tmp_path / repo_id
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text('{"model_type": "bert"}')
        (root / "model.safetensors").write_bytes(b"")
        if repo_id == "with-graph":
            (root / "onnx").mkdir(exist_ok=True)
            (root / "onnx" / "model.onnx").write_bytes(b"")
        return str(root)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(ember.installed, "torch_installed", lambda: False)
    resolve._download("ir-only", None)
    assert calls == [resolve.HUB_PATTERNS, resolve.OPENVINO_PATTERNS]
    calls.clear()
    resolve._download("with-graph", None)
    assert calls == [resolve.HUB_PATTERNS]
    calls.clear()
    monkeypatch.setattr(ember.installed, "torch_installed", lambda: True)
    resolve._download("ir-only", None)
    assert calls == [resolve.HUB_PATTERNS]
