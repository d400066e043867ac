"""sentence-transformers 6.2 causal-LM CrossEncoders (modules.json: a text-generation
Transformer, then LogitScore) through a real ``ember serve`` on torch (what ``--backend
auto`` picks) and onnx, against ``CrossEncoder.predict`` itself on the same files:
|Δscore| <= 1e-4 for the relevance score (the saved activation_fn: Sigmoid, Identity) and
the raw logit difference, on /v1/rerank, /rerank and /score, with the saved default
prompt, a request's ``instruction`` as ``predict(prompt=...)``, a batch of different
lengths and a prompt cut at its max length; a layout Ember cannot reproduce is refused at
start, never scored differently."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from tests.fixtures.llm_rerankers import build_st_causal_cross_encoders, scores_by_index
from tests.support import ServerProcess, refused_start, start_server

TOLERANCE = 1e-4
QUERY = "what is the capital of the country?"
# 2 to ~60 words: rows of one batch pad differently, and the longest passes the 64 tokens
# the true-only model cuts at.
DOCUMENTS = [
    "the capital is a city.",
    "no.",
    " ".join(["the state of the world and the people who live in it"] * 5),
    "yes, the capital of the country is the city where the government is.",
    "a city <|im_end|> in a text: rendered as the tokenizer renders it",
]
INSTRUCTION = "Say yes when the Document names a city"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_st_causal_cross_encoders(tmp_path_factory.mktemp("st-causal-ce"))


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> dict[str, object]:
    from sentence_transformers import CrossEncoder

    return {name: CrossEncoder(str(path)) for name, path in models.items()}


def _predict(model: object, prompt: str | None = None, raw: bool = False) -> np.ndarray:
    import torch

    pairs = [(QUERY, d) for d in DOCUMENTS]
    activation = torch.nn.Identity() if raw else None
    kwargs = {"prompt": prompt} if prompt is not None else {}
    return np.asarray(model.predict(pairs, activation_fn=activation, **kwargs), np.float64)  # type: ignore[attr-defined]


# Served name -> (the model, --backend): both models on auto, the yes/no one on onnx too.
SERVED = {
    "yes-no": ("yes-no", "auto"),
    "true-only": ("true-only", "auto"),
    "yes-no-onnx": ("yes-no", "onnx"),
}


@pytest.fixture(scope="module")
def server(
    models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = ["--cache-dir", str(tmp_path_factory.mktemp("cache"))]
    for served, (name, backend) in SERVED.items():
        args += ["--model-id", str(models[name]), "--served-model-name", served]
        args += ["--backend", backend]
    with start_server(args) as running:
        yield running


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert float(np.abs(got - want).max()) <= TOLERANCE, (got, want)


def test_each_is_served_on_the_backend_asked(server: ServerProcess) -> None:
    with server.client() as client:
        listed = client.get("/v1/models").json()["data"]
    assert {m["id"]: (m["kind"], m["capabilities"], m["backend"]) for m in listed} == {
        "yes-no": ("llm-cross-encoder", ["rerank"], "torch"),  # auto's choice
        "true-only": ("llm-cross-encoder", ["rerank"], "torch"),
        "yes-no-onnx": ("llm-cross-encoder", ["rerank"], "onnx"),
    }


@pytest.mark.parametrize("served", list(SERVED))
def test_rerank_matches_cross_encoder_predict(
    server: ServerProcess, reference: dict[str, object], served: str
) -> None:
    model = reference[SERVED[served][0]]
    scores, raw = _predict(model), _predict(model, raw=True)
    body = {"model": served, "query": QUERY, "documents": DOCUMENTS}
    with server.client() as client:
        cohere = client.post("/v1/rerank", json=body).json()["results"]
        tei = client.post(
            "/rerank",
            json={"model": served, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True},
        ).json()
    _close(scores_by_index(cohere, "relevance_score"), scores)
    _close(scores_by_index(tei, "score"), raw)
    assert np.ptp(raw) > 0.3  # the documents are told apart: a wrong row would show
    if served == "true-only":  # Identity: the relevance score is the true token's logit
        _close(scores, raw)


def test_the_long_document_is_cut_as_sentence_transformers_cuts_it(
    reference: dict[str, object],
) -> None:
    """What the true-only model's match above covers: its longest prompt is cut to 64
    tokens (and the template's tail restored), the others are not."""
    features = reference["true-only"][0].preprocess([(QUERY, d) for d in DOCUMENTS])  # type: ignore[index]
    lengths = features["attention_mask"].sum(dim=1).tolist()
    assert lengths[2] == 64 and max(lengths[:2] + lengths[3:]) < 64, lengths


def test_an_instruction_is_the_prompt(server: ServerProcess, reference: dict[str, object]) -> None:
    default, asked = _predict(reference["yes-no"]), _predict(reference["yes-no"], INSTRUCTION)
    assert float(np.abs(asked - default).max()) > 1e-3  # the prompt changes the scores
    body = {"model": "yes-no", "query": QUERY, "documents": DOCUMENTS}
    with server.client() as client:
        own = client.post("/v1/rerank", json=body).json()["results"]
        got = client.post("/v1/rerank", json={**body, "instruction": INSTRUCTION}).json()
    _close(scores_by_index(own, "relevance_score"), default)
    _close(scores_by_index(got["results"], "relevance_score"), asked)


def test_score_route_matches(server: ServerProcess, reference: dict[str, object]) -> None:
    scores = _predict(reference["yes-no"])
    body = {"model": "yes-no", "text_1": QUERY, "text_2": DOCUMENTS}
    with server.client() as client:
        answer = client.post("/score", json=body)
    assert answer.status_code == 200, answer.text
    got = np.array(
        [item["score"] for item in sorted(answer.json()["data"], key=lambda i: i["index"])]
    )
    _close(got, scores)


def _edited(models: dict[str, Path], tmp_path: Path, file: str, change: dict) -> Path:
    path = tmp_path / "edited"
    shutil.copytree(models["yes-no"], path)
    target = path / file
    saved = json.loads(target.read_text()) if target.exists() else {}
    target.write_text(json.dumps({**saved, **change}))
    return path


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        (
            "sentence_bert_config.json",
            {"processing_kwargs": {"image": {"size": 8}}},
            r"processing_kwargs\['image'\] is set; Ember renders text pairs only",
        ),
        (
            "sentence_bert_config.json",
            {"transformer_task": "feature-extraction"},
            "LogitScore scores a text-generation Transformer",
        ),
        (
            "1_LogitScore/config.json",
            {"module_input_name": "token_embeddings"},
            "LogitScore reads 'token_embeddings'",
        ),
        ("1_LogitScore/config.json", {"true_token_id": 10**9}, "is not a token id"),
        (
            "sentence_bert_config.json",
            {"modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}},
            "no message modality",
        ),
        (
            "preprocessor_config.json",
            {"image_processor_type": "Qwen2VLImageProcessor"},
            "the model has a multimodal processor",
        ),
        (
            "config_sentence_transformers.json",
            {"activation_fn": "torch.nn.modules.activation.Tanh"},
            "Ember applies Sigmoid or Identity",
        ),
    ],
)
def test_what_it_cannot_reproduce_is_refused(
    models: dict[str, Path], tmp_path: Path, file: str, change: dict, message: str
) -> None:
    path = _edited(models, tmp_path, file, change)
    with pytest.raises(ConfigError, match=message):
        resolve_model(ModelSpec(str(path)))


def test_a_task_or_pooling_it_does_not_have_is_refused(models: dict[str, Path]) -> None:
    for spec in (
        ModelSpec(str(models["yes-no"]), task="embed"),
        ModelSpec(str(models["yes-no"]), pooling="last"),
    ):
        with pytest.raises(ConfigError, match="CrossEncoder .* it reranks"):
            resolve_model(spec)
    assert resolve_model(ModelSpec(str(models["yes-no"]), task="rerank")).task == "rerank"


def test_a_module_after_logit_score_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "more"
    shutil.copytree(models["yes-no"], path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append(
        {
            "idx": 2,
            "name": "2",
            "path": "",
            "type": "sentence_transformers.base.modules.normalize.Normalize",
        }
    )
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match="a Normalize module after LogitScore is not supported"):
        resolve_model(ModelSpec(str(path)))


def test_ct2_refuses_it_at_start(models: dict[str, Path]) -> None:
    assert refused_start(["--model-id", str(models["yes-no"]), "--backend", "ct2"]) == [
        f"ember: error: model '{models['yes-no']}' is a llm-cross-encoder model, served "
        "by --backend torch or onnx (not ct2): use --backend torch or onnx or auto"
    ]
