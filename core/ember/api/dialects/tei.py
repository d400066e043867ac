"""TEI's dialect (text-embeddings-inference's routes, and what Hugging Face's
``InferenceClient`` sends them): ``/embed``, ``/embed_sparse``, ``/embed_all``, ``/rerank``
with ``texts``, ``/predict``, ``/similarity``, ``/tokenize``, ``/decode``, ``/info``, and
``/`` with the Inference API's text-classification ``parameters``: their bodies, their
answers and the translators between them and the engine.

What TEI does (``router/src/http/server.rs``): ``/`` is bound at start-up to one handler by
the served model's type: ``/predict`` for a classifier, ``/rerank`` for a reranker, and for
an embedding model ``/embed`` (``/embed_sparse`` for SPLADE, ``/similarity`` when started
with ``TASK=sentence-similarity``). ``/similarity`` embeds the source sentence and the
others and answers their cosine similarities; ``/decode`` answers one string per id list.

What ``InferenceClient`` (huggingface_hub 2.4, provider ``hf-inference``, which posts to a
URL given as ``model`` as it is) sends, read from its source:
- ``feature_extraction``: ``{"inputs", "normalize", "prompt_name", "truncate",
  "truncation_direction", "dimensions", "encoding_format"}`` at the top level, unset ones
  left out; it reads ``[[float]]``.
- ``sentence_similarity``: ``{"inputs": {"source_sentence", "sentences"}, "parameters": {}}``;
  it reads ``[float]``.
- ``text_classification``: ``{"inputs", "parameters": {"function_to_apply", "top_k"}}``,
  ``parameters`` always sent (``{}`` when both are unset); it reads ``[[{"label", "score"}]]``
  and returns the inner list (TEI's flat ``[{"label", "score"}]`` would give it only the
  best label), so a body with ``parameters`` gets the nested shape.

Ember serves several models, so ``/`` reads the body first: ``{"query", "texts"}`` reranks,
an ``inputs`` object is a similarity, and text ``inputs`` goes by the model's kind as on
TEI (a classifier predicts, an embedding model embeds). With no ``model`` and several
served, text ``inputs`` goes to the model that embeds, and with ``parameters`` (the
Inference API's classification body) to the model that classifies.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, RootModel, Tag

from ember.api.dialects import LabelScore, Translator, as_list, classify_request, label_rows, of
from ember.api.dialects.long_documents import (
    ChunkItem,
    LongDocumentFields,
    chunk_items,
    document_vectors,
    long_document_options,
)
from ember.api.dialects.long_rerank import LongRerankFields, RerankChunk, chunk_of
from ember.api.dialects.openai import dense_dimensions
from ember.api.operations import Reply, check_batch, run
from ember.api.schemas import (
    INSTRUCTION,
    NonEmptyText,
    PositiveInt,
    StrictBool,
    StrictInt,
    TokenIds,
    _Body,
    _Part,
)
from ember.capabilities import Capability
from ember.engine import Engine, EngineArray, Result, Timings
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.errors import BadRequest, Forbidden, NotReady
from ember.outputs import (
    ChunkedVectors,
    DenseVectors,
    Labels,
    MultiVectors,
    OutputValue,
    Scores,
    SparseVectors,
    is_dense,
    output_type,
)

Direction = Literal["right", "left", "Right", "Left"]


class TEIEmbedRequest(LongDocumentFields):
    """TEI ``POST /embed`` (and Ember's long-document fields)."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    normalize: StrictBool = True
    truncate: StrictBool = True
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = None
    dimensions: StrictInt | None = None
    model: str | None = None


class TEIEmbedOutputRequest(LongDocumentFields):
    """TEI ``POST /embed_sparse`` and ``/embed_all`` (the long-document fields refused)."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    truncate: StrictBool = True
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = Field(
        None, description="A prompt of the model's; on ColBERT models `query` or `document`."
    )
    model: str | None = None


class TEIRerankRequest(LongRerankFields):
    """TEI ``POST /rerank``: told apart from Cohere's body by ``texts``."""

    query: NonEmptyText
    texts: Annotated[list[NonEmptyText], Field(min_length=1)]
    top_n: PositiveInt | None = Field(
        None, description="Return only the best N (LiteLLM's huggingface/ sends it)."
    )
    return_text: StrictBool = False
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    model: str | None = None
    instruction: NonEmptyText | None = Field(None, description=INSTRUCTION)


class TEIPredictRequest(_Body):
    """TEI ``POST /predict``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    model: str | None = None


class TEITokenizeRequest(_Body):
    """TEI ``POST /tokenize``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    add_special_tokens: StrictBool = True
    prompt_name: str | None = None
    model: str | None = None


class DecodeRequest(_Body):
    """TEI ``POST /decode``."""

    ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="One token-id list or a list of them."
    )
    skip_special_tokens: StrictBool = True
    model: str | None = None


class SimilarityInputs(_Part):
    source_sentence: NonEmptyText
    sentences: Annotated[list[NonEmptyText], Field(min_length=1)]


class SimilarityParameters(_Part):
    truncate: StrictBool = True
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class SimilarityRequest(_Body):
    """TEI ``POST /similarity`` (and ``/`` with an ``inputs`` object)."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    model: str | None = None


class ClassificationParameters(_Part):
    """The Inference API's text-classification parameters (``InferenceClient`` sends them)."""

    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None
    top_k: PositiveInt | None = None


class RootInputsRequest(TEIEmbedRequest):
    """``POST /`` with text ``inputs``: /embed's fields, /predict's ``raw_scores``, and the
    Inference API's classification ``parameters``."""

    raw_scores: StrictBool = False
    parameters: ClassificationParameters | None = None


# The answers


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = Field(None, description="With `return_text`.")
    chunk: RerankChunk | None = Field(
        None, description="With `max_tokens_per_doc` / `max_chunks_per_doc`: the best chunk."
    )


class SparseValue(BaseModel):
    index: int
    value: float


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TEIChunkedInput(BaseModel):
    """One input chunked (with a ``chunking`` object): its aggregate and its chunks."""

    embedding: list[float] | None = Field(description="The aggregate; null with aggregate none.")
    chunks: list[ChunkItem]


class TEIEmbedResponse(RootModel[list[list[float]] | list[TEIChunkedInput]]):
    """One vector per input; with a ``chunking`` object, one ``{embedding, chunks}`` per
    input (``overflow`` chunk alone keeps TEI's list of vectors: each input's aggregate)."""


class TEIEmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """Per input: the non-zero weights, sorted by index."""


class TEIEmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input: one vector per kept token."""


class TEIRerankResponse(RootModel[list[TEIRank]]):
    """The best ``top_n`` texts, best first."""


class TEIPredictResponse(RootModel[list[LabelScore] | list[list[LabelScore]]]):
    """Every label, best first: one list for a string input, a list of them for a list."""


class InferenceClassifyResponse(RootModel[list[list[LabelScore]]]):
    """Per input, its labels scored by ``function_to_apply``, cut to ``top_k``."""


class TokenizeResponse(RootModel[list[list[Token]]]):
    """Per input: its tokens."""


class DecodeResponse(RootModel[list[str]]):
    """One text per id list."""


class SimilarityResponse(RootModel[list[float]]):
    """The cosine of the source sentence to each sentence."""


class RootResponse(
    RootModel[
        list[list[float]]
        | list[TEIChunkedInput]
        | list[list[SparseValue]]
        | list[list[list[float]]]
        | list[LabelScore]
        | list[list[LabelScore]]
        | list[TEIRank]
        | list[float]
    ]
):
    """What the route it stands for answers: /embed (chunked inputs too), /embed_sparse,
    /embed_all, /predict
    (``[[{"label", "score"}]]`` with the Inference API's ``parameters``), /rerank (TEI's)
    or /similarity."""


def text_request(
    texts: list,
    body: TEIEmbedOutputRequest | SimilarityParameters,
    output: type[OutputValue],
    **fields: Any,
) -> EmbedRequest:
    """A TEI body's text fields (``truncate``, ``truncation_direction`` in either case,
    ``prompt_name``) as an engine request for ``output``, with the route's own ``fields``."""
    long: dict[str, Any] = {}
    if isinstance(body, LongDocumentFields):
        long = long_document_options(body, body.truncate)
    return EmbedRequest(
        texts,
        output=output.kind,
        truncate=long.pop("truncate", body.truncate),
        truncation_direction=body.truncation_direction.lower(),  # type: ignore[arg-type]
        prompt_name=body.prompt_name,
        **long,
        **fields,
    )


class _Inputs(Translator[Any, Any]):
    """A body whose ``inputs`` is one text or a list of them."""

    field = "inputs"

    def count(self, body: Any) -> int:
        return len(as_list(body.inputs))


class Embed(_Inputs):
    """``/embed``: ``[[float]]``."""

    def decode(self, body: TEIEmbedRequest, engine: Engine) -> EmbedRequest:
        if body.aggregate == "none" and body.chunking is None:
            raise BadRequest(
                "TEI's answer holds one vector per input: aggregate 'none' needs a "
                "`chunking` object (each input then answers its chunks)",
                param="aggregate",
            )
        return text_request(
            as_list(body.inputs),
            body,
            DenseVectors,
            normalize=body.normalize,
            dimensions=body.dimensions,
        )

    def encode(self, body: TEIEmbedRequest, engine: Engine, result: Result) -> TEIEmbedResponse:
        output = result.output
        if isinstance(output, ChunkedVectors) and body.chunking is not None:
            documents = document_vectors(output, base64=False)
            items = [
                of(TEIChunkedInput, embedding=vector, chunks=chunk_items(output, i, False))
                for i, vector in enumerate(documents)
            ]
            return of(TEIEmbedResponse, root=items)
        return of(TEIEmbedResponse, root=result.outputs)


class EmbedOutput(_Inputs):
    """A TEI route of one embedding output other than dense (``output``)."""

    output: type[SparseVectors] | type[MultiVectors]

    def pick(self, body: TEIEmbedOutputRequest) -> Capability:
        return self.output.capability

    def decode(self, body: TEIEmbedOutputRequest, engine: Engine) -> EmbedRequest:
        return text_request(as_list(body.inputs), body, self.output)


class EmbedSparse(EmbedOutput):
    """``/embed_sparse``: per input ``[{"index", "value"}]`` sorted by index, zeros dropped."""

    output = SparseVectors

    def encode(
        self, body: TEIEmbedOutputRequest, engine: Engine, result: Result
    ) -> TEIEmbedSparseResponse:
        assert isinstance(result.output, SparseVectors)
        rows = [
            [
                of(SparseValue, index=int(i), value=float(v))
                for i, v in zip(vec.indices, vec.values, strict=True)
            ]
            for vec in result.output.vectors
        ]
        return of(TEIEmbedSparseResponse, root=rows)


class EmbedAll(EmbedOutput):
    """``/embed_all``: per input one vector per token, ``[[[float]]]``."""

    output = MultiVectors

    def encode(
        self, body: TEIEmbedOutputRequest, engine: Engine, result: Result
    ) -> TEIEmbedAllResponse:
        return of(TEIEmbedAllResponse, root=result.outputs)


class Rerank(Translator[TEIRerankRequest, RerankRequest]):
    """TEI's ``/rerank`` (``texts``): ``[{"index", "score"(, "text")}]``, best first."""

    capability = "rerank"
    field = "texts"

    def count(self, body: TEIRerankRequest) -> int:
        return len(body.texts)

    def decode(self, body: TEIRerankRequest, engine: Engine) -> RerankRequest:
        return RerankRequest(
            body.query,
            body.texts,
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            instruction=body.instruction,
            scale="probability",
            **body.chunking(),
        )

    def encode(self, body: TEIRerankRequest, engine: Engine, result: Result) -> TEIRerankResponse:
        assert isinstance(result.output, Scores)
        scores = result.output.values
        ranked = []
        for i in result.output.best_first(body.top_n):
            fields: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if body.return_text:
                fields["text"] = body.texts[i]
            chunk = chunk_of(result.output, int(i))
            if chunk is not None:
                fields["chunk"] = chunk
            ranked.append(of(TEIRank, **fields))
        return of(TEIRerankResponse, root=ranked)


class Predict(_Inputs):
    """``/predict``: ``[{"label", "score"}]`` for one text, a list of them for several."""

    capability = "classify"

    def decode(self, body: TEIPredictRequest, engine: Engine) -> ClassifyRequest:
        return classify_request(as_list(body.inputs), body)

    def encode(self, body: TEIPredictRequest, engine: Engine, result: Result) -> TEIPredictResponse:
        assert isinstance(result.output, Labels)
        rows = label_rows(result.output.rows)
        return of(TEIPredictResponse, root=rows[0] if isinstance(body.inputs, str) else rows)


class InferenceClassify(Predict):
    """``/`` with ``parameters``, the Inference API's text classification:
    ``[[{"label", "score"}]]``, one list per input, scored by ``function_to_apply``
    (default: the model's own, as /predict scores) and cut to ``top_k``."""

    def decode(self, body: RootInputsRequest, engine: Engine) -> ClassifyRequest:
        assert body.parameters is not None
        applied = body.parameters.function_to_apply is not None  # raw, then applied here
        return classify_request(as_list(body.inputs), body, raw_scores=applied)

    def encode(  # type: ignore[override]  # the Inference API's nested rows, always
        self, body: RootInputsRequest, engine: Engine, result: Result
    ) -> InferenceClassifyResponse:
        assert isinstance(result.output, Labels) and body.parameters is not None
        parameters = body.parameters
        applied = result.output.applied(parameters.function_to_apply, parameters.top_k)
        return of(InferenceClassifyResponse, root=label_rows(applied.rows))


class Similarity(Translator[SimilarityRequest, EmbedRequest]):
    """``/similarity``: the cosine of the source sentence to each of the others."""

    field = "inputs.sentences"

    def count(self, body: SimilarityRequest) -> int:
        return 1 + len(body.inputs.sentences)

    def decode(self, body: SimilarityRequest, engine: Engine) -> EmbedRequest:
        texts = [body.inputs.source_sentence, *body.inputs.sentences]
        options = body.parameters or SimilarityParameters()
        return text_request(texts, options, DenseVectors, normalize=True)

    def encode(self, body: SimilarityRequest, engine: Engine, result: Result) -> SimilarityResponse:
        assert isinstance(result.output, DenseVectors)
        others = range(1, len(body.inputs.sentences) + 1)
        cosines = result.output.cosine([0] * len(others), others)
        return of(SimilarityResponse, root=[float(v) for v in cosines.values])


EMBED = Embed()
EMBED_SPARSE = EmbedSparse()
EMBED_ALL = EmbedAll()
RERANK = Rerank()
PREDICT = Predict()
INFERENCE_CLASSIFY = InferenceClassify()
SIMILARITY = Similarity()


def _root_kind(value: Any) -> str:
    if isinstance(value, dict):
        if "texts" in value:
            return "rerank"
        if isinstance(value.get("inputs"), dict):
            return "similarity"
    return "inputs"


RootRequest = Annotated[
    Annotated[RootInputsRequest, Tag("inputs")]
    | Annotated[SimilarityRequest, Tag("similarity")]
    | Annotated[TEIRerankRequest, Tag("rerank")],
    Discriminator(_root_kind),
]


async def decode(engines: EngineArray, body: DecodeRequest, limit: int) -> Reply[DecodeResponse]:
    """One text per id list (TEI answers a list even for one)."""
    ids = body.ids if isinstance(body.ids[0], list) else [body.ids]
    check_batch(len(ids), limit, "ids")
    async with engines.serving(engines.tokenizing(body.model), body.keep_alive) as engine:
        processor = engine.processor
        if processor is None:
            raise NotReady(f"model {engine.name!r} is still loading")
        texts = await asyncio.to_thread(
            processor.decode,
            ids,
            skip_special_tokens=body.skip_special_tokens,
        )
    return Reply(of(DecodeResponse, root=texts), Timings())


async def tokenize(
    engines: EngineArray, body: TEITokenizeRequest, limit: int
) -> Reply[TokenizeResponse]:
    """/tokenize; with no ``model`` and several served, the first model that tokenises."""
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    check_batch(len(texts), limit, "inputs")
    async with engines.serving(engines.tokenizing(body.model), body.keep_alive) as engine:
        if body.prompt_name and engine.text_inputs is not None:
            texts = engine.text_inputs.with_prompt(texts, body.prompt_name)
        rows = await engine.tokenize(texts, add_special_tokens=body.add_special_tokens)
    tokens = [[of(Token, **token) for token in row] for row in rows]
    return Reply(of(TokenizeResponse, root=tokens), Timings())


def _root_engine(engines: EngineArray, body: RootInputsRequest) -> Engine:
    if body.model or len(engines.engines) == 1:
        engine = engines.get(body.model)
    else:
        embeds = any(e.model is not None and e.family.does("embed") for e in engines)
        asked = "classify" if body.parameters is not None or not embeds else "embed"
        engine = engines.for_task(None, asked)
    return engine


async def root(engines: EngineArray, body: Any, limit: int) -> Reply[RootResponse]:
    """``POST /``: the body says rerank or similarity; text ``inputs`` go by the model's
    kind (predict for a classifier, else its embedding: dense, sparse or multi-vector)."""
    if isinstance(body, TEIRerankRequest):
        return await run(RERANK, engines, body, limit)
    if isinstance(body, SimilarityRequest):
        return await run(SIMILARITY, engines, body, limit)
    engine = _root_engine(engines, body)
    if engine.model is None:  # a model that loads on demand: load it to learn its kind
        async with engines.serving(engine, body.keep_alive) as engine:
            pass
    kind, name = engine.family, engine.name
    named = body.model_copy(update={"model": name})
    if kind.classifies:
        if body.parameters is not None:
            return await run(INFERENCE_CLASSIFY, engines, named, limit)
        return await run(PREDICT, engines, named, limit)
    embedding = output_type(kind.embedding) if kind.embedding is not None else None
    if embedding is DenseVectors:
        return await run(EMBED, engines, named, limit)
    if embedding is SparseVectors or embedding is MultiVectors:
        output = EMBED_SPARSE if embedding is SparseVectors else EMBED_ALL
        return await run(output, engines, named, limit)
    raise BadRequest(
        f"model {name!r} ({kind.name}) does not embed or classify; it serves {kind.serves()}: "
        'send {"query", "texts"} to rerank',
        param="inputs",
    )


# GET /info


class InfoResponse(BaseModel):
    """TEI's /info for the first model (the model facts once it has loaded)."""

    model_id: str
    version: str
    models: list[str]
    max_client_batch_size: int
    model_sha: str | None = None
    model_dtype: str | None = None
    model_type: dict[str, Any] | None = None
    backend: str | None = None
    device: str | None = None
    backend_details: dict[str, Any] | None = Field(
        None, description="As /v1/models says it: what `--backend auto` chose and why."
    )
    max_input_length: int | None = None
    dimensions: int | None = Field(
        None, description="Width of the first model's dense embedding, after its Dense layers."
    )
    max_batch_tokens: int | None = None
    max_batch_requests: int | None = None
    max_concurrent_requests: int | None = None


def info(engines: EngineArray, version: str, max_client_batch_size: int) -> InfoResponse:
    """TEI's /info for the first model the request's API key may use; ``models`` lists
    every served one it may use. Forbidden for a key that may use none."""
    visible = engines.visible()
    if not visible:
        raise Forbidden("this API key may use none of the served models", param="model")
    first = visible[0]
    facts: dict[str, Any] = {}
    if first.model is not None and first.backend is not None and first.processor is not None:
        m = first.model
        facts = dict(
            model_sha=None,
            model_dtype=first.backend.info.dtype,
            model_type=_model_type(first),
            backend=first.backend.info.name,
            backend_details=first.backend.info.details,  # /v1/models' too: what auto chose
            device=first.backend.info.device,
            max_input_length=first.processor.max_length,
            dimensions=dense_dimensions(m),
            max_batch_tokens=first.spec.max_batch_tokens,
            max_batch_requests=first.spec.max_batch_size,
            max_concurrent_requests=first.spec.max_queue_size,
        )
    return InfoResponse(
        model_id=first.name,
        version=version,
        models=[engine.name for engine in visible],
        max_client_batch_size=max_client_batch_size,
        **facts,
    )


def _model_type(engine: Engine) -> dict[str, Any]:
    """TEI's ``model_type``: the pooling of an embedding model, a reranker's or a
    classifier's labels."""
    m = engine.model
    assert m is not None
    if m.task == "embed":
        pooling = "+".join(m.poolings) if is_dense(engine.family.embedding) else engine.family.name
        return {"embedding": {"pooling": pooling}}
    kind = "reranker" if m.task == "rerank" else "classifier"
    labels = {str(k): v for k, v in m.id2label.items()}
    return {kind: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}}
