"""TEI's dialect (text-embeddings-inference's routes, and what Hugging Face's
``InferenceClient`` sends them): ``/embed``, ``/embed_sparse``, ``/embed_all``, ``/rerank``
with ``texts``, ``/predict``, ``/similarity``, and ``/`` with the Inference API's
text-classification ``parameters``. ``ember.api.tei`` routes ``/`` to these by the body
and the model's kind."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ember.api import schemas as s
from ember.api.dialects import Translator, as_list, classify_request
from ember.api.schemas import NonEmptyText, StrictBool, StrictInt, _Body
from ember.capabilities import Capability
from ember.engine import Engine, Result
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.outputs import DenseVectors, Labels, MultiVectors, OutputValue, Scores, SparseVectors

Direction = Literal["right", "left", "Right", "Left"]


class SimilarityInputs(_Body):
    source_sentence: NonEmptyText
    sentences: Annotated[list[NonEmptyText], Field(min_length=1)]


class SimilarityParameters(_Body):
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class SimilarityRequest(_Body):
    """TEI ``POST /similarity`` (and ``/`` with an ``inputs`` object)."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    model: str | None = None


class ClassificationParameters(_Body):
    """The Inference API's text-classification parameters (``InferenceClient`` sends them)."""

    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None
    top_k: StrictInt | None = Field(None, ge=1)


class RootInputsRequest(s.TEIEmbedRequest):
    """``POST /`` with text ``inputs``: /embed's fields, /predict's ``raw_scores``, and the
    Inference API's classification ``parameters``."""

    raw_scores: StrictBool = False
    parameters: ClassificationParameters | None = None


def text_request(
    texts: list,
    body: s.TEIEmbedOutputRequest | SimilarityParameters,
    output: type[OutputValue],
    **fields: Any,
) -> EmbedRequest:
    """A TEI body's text fields (``truncate``, ``truncation_direction`` in either case,
    ``prompt_name``) as an engine request for ``output``, with the route's own ``fields``."""
    return EmbedRequest(
        texts,
        output=output.kind,
        truncate=body.truncate,
        truncation_direction=body.truncation_direction.lower(),  # type: ignore[arg-type]
        prompt_name=body.prompt_name,
        **fields,
    )


class _Inputs(Translator[Any, Any]):
    """A body whose ``inputs`` is one text or a list of them."""

    field = "inputs"

    def count(self, body: Any) -> int:
        return len(as_list(body.inputs))


class Embed(_Inputs):
    """``/embed``: ``[[float]]``."""

    def decode(self, body: s.TEIEmbedRequest, engine: Engine) -> EmbedRequest:
        return text_request(
            as_list(body.inputs),
            body,
            DenseVectors,
            normalize=body.normalize,
            dimensions=body.dimensions,
        )

    def encode(self, body: s.TEIEmbedRequest, engine: Engine, result: Result) -> Any:
        return result.outputs


class EmbedOutput(_Inputs):
    """``/embed_sparse`` (per input ``[{"index", "value"}]`` sorted by index, zeros
    dropped) and ``/embed_all`` (per input one vector per token, ``[[[float]]]``)."""

    def __init__(self, output: type[SparseVectors] | type[MultiVectors]) -> None:
        self.output = output

    def pick(self, body: s.TEIEmbedOutputRequest) -> Capability:
        return self.output.capability

    def decode(self, body: s.TEIEmbedOutputRequest, engine: Engine) -> EmbedRequest:
        return text_request(as_list(body.inputs), body, self.output)

    def encode(self, body: s.TEIEmbedOutputRequest, engine: Engine, result: Result) -> Any:
        if not isinstance(result.output, SparseVectors):
            return result.outputs
        return [
            [
                {"index": int(i), "value": float(v)}
                for i, v in zip(vec.indices, vec.values, strict=True)
            ]
            for vec in result.output.vectors
        ]


class Rerank(Translator[s.TEIRerankRequest, RerankRequest]):
    """TEI's ``/rerank`` (``texts``): ``[{"index", "score"(, "text")}]``, best first."""

    capability = "rerank"
    field = "texts"

    def count(self, body: s.TEIRerankRequest) -> int:
        return len(body.texts)

    def decode(self, body: s.TEIRerankRequest, engine: Engine) -> RerankRequest:
        return RerankRequest(
            body.query,
            body.texts,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            instruction=body.instruction,
            scale="probability",
        )

    def encode(self, body: s.TEIRerankRequest, engine: Engine, result: Result) -> Any:
        assert isinstance(result.output, Scores)
        scores = result.output.values
        ranked = []
        for i in result.output.best_first(body.top_n):
            item: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if body.return_text:
                item["text"] = body.texts[i]
            ranked.append(item)
        return ranked


class Predict(_Inputs):
    """``/predict``: ``[{"label", "score"}]`` for one text, a list of them for several."""

    capability = "classify"

    def decode(self, body: s.TEIPredictRequest, engine: Engine) -> ClassifyRequest:
        return classify_request(as_list(body.inputs), body)

    def encode(self, body: s.TEIPredictRequest, engine: Engine, result: Result) -> Any:
        assert isinstance(result.output, Labels)
        rows = result.output.rows
        return rows[0] if isinstance(body.inputs, str) else rows


class InferenceClassify(Predict):
    """``/`` with ``parameters``, the Inference API's text classification:
    ``[[{"label", "score"}]]``, one list per input, scored by ``function_to_apply``
    (default: the model's own, as /predict scores) and cut to ``top_k``."""

    def decode(self, body: RootInputsRequest, engine: Engine) -> ClassifyRequest:
        assert body.parameters is not None
        applied = body.parameters.function_to_apply is not None  # raw, then applied here
        return classify_request(as_list(body.inputs), body, raw_scores=applied)

    def encode(self, body: RootInputsRequest, engine: Engine, result: Result) -> Any:
        assert isinstance(result.output, Labels) and body.parameters is not None
        parameters = body.parameters
        return result.output.applied(parameters.function_to_apply, parameters.top_k).rows


class Similarity(Translator[SimilarityRequest, EmbedRequest]):
    """``/similarity``: the cosine of the source sentence to each of the others."""

    field = "inputs.sentences"

    def count(self, body: SimilarityRequest) -> int:
        return 1 + len(body.inputs.sentences)

    def decode(self, body: SimilarityRequest, engine: Engine) -> EmbedRequest:
        texts = [body.inputs.source_sentence, *body.inputs.sentences]
        options = body.parameters or SimilarityParameters()
        return text_request(texts, options, DenseVectors, normalize=True)

    def encode(self, body: SimilarityRequest, engine: Engine, result: Result) -> Any:
        assert isinstance(result.output, DenseVectors)
        others = range(1, len(body.inputs.sentences) + 1)
        cosines = result.output.cosine([0] * len(others), others)
        return [float(v) for v in cosines.values]


EMBED = Embed()
EMBED_SPARSE = EmbedOutput(SparseVectors)
EMBED_ALL = EmbedOutput(MultiVectors)
RERANK = Rerank()
PREDICT = Predict()
INFERENCE_CLASSIFY = InferenceClassify()
SIMILARITY = Similarity()
