"""Each API dialect is a translator: its bodies decode into typed engine requests (the
fields every dialect shares decided once, in the request), and the route table wires
every model route through the same run."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from ember.api import operations as ops
from ember.api.dialects import cohere, dumps, infinity, of, openai, sagemaker, tei, vllm
from ember.api.routes import ROUTES
from ember.errors import BadRequest
from ember.families.registry import by_name
from ember.outputs import SparseVector

# A model still loading: what decode reads of an engine before the model is known.
LOADING = SimpleNamespace(model=None, name="m", spec=SimpleNamespace(embedding_dtype="float32"))


def model(family: str) -> SimpleNamespace:
    """What ``EmbedRequest.validated`` reads of a resolved model."""
    return SimpleNamespace(family=by_name(family), hidden_size=8, prompts={})


def test_every_engine_route_is_a_translator_run() -> None:
    own = {"/tokenize", "/decode", "/", "/rerank"}  # tokenizer routes and body-routed ones
    for route in ROUTES:
        if set(route.paths) & own:
            continue
        assert isinstance(route.operation, partial) and route.operation.func is ops.run
        assert hasattr(route.operation.args[0], "decode"), route.paths


@pytest.mark.parametrize(
    ("translator", "body"),
    [
        (openai.EMBEDDINGS, openai.EmbeddingsRequest(input=["a"], dimensions=0)),
        (infinity.EMBEDDINGS_IMAGE, infinity.MediaEmbeddingsRequest(input=["x"], dimensions=0)),
        (tei.EMBED, tei.TEIEmbedRequest(inputs="a", dimensions=0)),
    ],
)
def test_zero_dimensions_are_the_full_size_in_every_dialect(translator, body) -> None:
    assert translator.decode(body, LOADING).dimensions is None


def test_vllm_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    body = openai.EmbeddingsRequest(input="a", truncate_prompt_tokens=4)
    request = openai.EMBEDDINGS.decode(body, LOADING)
    assert (request.max_tokens, request.truncation_direction) == (4, "left")


def test_cohere_output_dimension_is_range_checked_once_under_its_own_name() -> None:
    body = cohere.CohereEmbedV2Request(texts=["a"], output_dimension=9, truncate="start")
    request = cohere.EMBED.decode(body, LOADING)
    assert (request.truncate, request.truncation_direction) == (True, "left")
    with pytest.raises(BadRequest, match="between 1 and 8") as refused:
        request.validated(model("dense"), "m")
    assert refused.value.param == "output_dimension"


def test_cohere_names_the_field_its_inputs_came_in() -> None:
    assert cohere.EMBED.named(cohere.CohereEmbedRequest(texts=["a"])) == "texts"
    images = cohere.CohereEmbedRequest(images=["data:image/png;base64,AAAA"])
    assert (cohere.EMBED.named(images), cohere.EMBED.pick(images)) == ("images", "image_embed")


def test_tei_takes_either_case_of_truncation_direction() -> None:
    body = tei.TEIEmbedOutputRequest(inputs=["a"], truncation_direction="Left")
    assert tei.EMBED_SPARSE.decode(body, LOADING).truncation_direction == "left"


def test_vllm_score_reranks_once_per_distinct_text_1() -> None:
    body = vllm.ScoreRequest(text_1=["q", "q", "r"], text_2=["a", "b", "c"])
    request = vllm.SCORE.decode(body, LOADING)
    assert [(r.query, list(r.documents), where) for r, where in request.reranks] == [
        ("q", ["a", "b"], [0, 1]),
        ("r", ["c"], [2]),
    ]


def test_sagemaker_records_decode_to_texts_and_encode_with_their_ids() -> None:
    records = sagemaker.records(b'"plain"\n\n{"id": 7, "text": "t"}\n{"input": "body"}\n')
    assert [sagemaker.decode(r, i) for i, r in enumerate(records, 1)] == ["plain", "t", None]
    sparse = SparseVector([1], [0.5])
    assert sagemaker.encode(records[1], sparse) == {
        "id": 7,
        "embedding": {"indices": [1], "values": [0.5]},
    }
    with pytest.raises(BadRequest, match="record 1"):
        sagemaker.decode({"other": 1}, 1)


def test_answers_are_written_as_built_with_unset_fields_left_out() -> None:
    rows = np.array([[0.5, -1.0]], dtype=np.float32)
    bare = of(cohere.RerankResult, index=1, relevance_score=0.5)
    answer = of(tei.TEIEmbedResponse, root=list(rows))
    assert dumps([bare, answer]) == b'[{"index":1,"relevance_score":0.5},[[0.5,-1.0]]]'
    assert bare.model_fields_set == {"index", "relevance_score"}


def test_each_route_documents_what_its_code_returns() -> None:
    by_path = {path: route for route in ROUTES for path in route.paths}
    assert by_path["/v1/embeddings"].answer is openai.EmbeddingsResponse
    assert by_path["/embed_sparse"].answer is tei.TEIEmbedSparseResponse
    assert by_path["/decode"].answer is tei.DecodeResponse  # an operation's Reply[...]
