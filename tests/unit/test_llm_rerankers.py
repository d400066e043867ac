"""LLM rerankers without a forward pass: how each family is detected from its files (and
what is refused, in one line), the prompt ids against each reference's (the documented
algorithms transcribed in ``tests/fixtures/llm_rerankers.py``, run on transformers'
tokenizer), truncation included, and which backends take them."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from ember.backends import ct2_backend
from ember.backends.choice import choose_backend
from ember.backends.neuron_export import compile_options
from ember.errors import BadRequest, ConfigError
from ember.families.llm_reranker.templates import TEMPLATES, LlmReranker, answer_token_ids
from ember.families.registry import by_name
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from ember.processors import build_processor
from tests.fixtures.llm_rerankers import (
    ANSWERS,
    REFERENCE_INPUTS,
    build_tiny_gemma_reranker,
    build_tiny_mxbai_reranker,
    build_tiny_qwen3_reranker,
)
from tests.fixtures.tiny_models import build_tiny_decoder_embedder

FAMILY_NAMES = {
    "qwen3": "qwen3-reranker",
    "mxbai": "mxbai-rerank-v2",
    "gemma": "bge-reranker-v2-gemma",
}
# ~10,000 tokens: past every family's budget (8,192 for Qwen3 and mxbai, 512 for Gemma).
LONG = " ".join(["the people of the state and the world"] * 1250)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm-rerankers")
    return {
        "qwen3": build_tiny_qwen3_reranker(root),
        "mxbai": build_tiny_mxbai_reranker(root),
        "gemma": build_tiny_gemma_reranker(root),
    }


def _renamed(path: Path, tmp_path: Path, name: str) -> Path:
    """The same files in a directory named otherwise."""
    target = tmp_path / name
    shutil.copytree(path, target)
    return target


@pytest.mark.parametrize("family", ["qwen3", "mxbai", "gemma"])
def test_each_family_is_detected_with_its_answer_tokens(
    models: dict[str, Path], family: str
) -> None:
    from transformers import AutoTokenizer

    model = resolve_model(ModelSpec(str(models[family])))
    assert model.family is by_name("llm-reranker") and model.task == "rerank"
    assert (
        isinstance(model.facts, LlmReranker) and model.facts.template.name == FAMILY_NAMES[family]
    )
    assert model.family.capabilities == ["rerank"]
    tok = AutoTokenizer.from_pretrained(str(models[family]))
    want = [tok.convert_tokens_to_ids(t) for t in ANSWERS[family] if t is not None]
    assert list(model.facts.token_ids) == want


@pytest.mark.parametrize("family", ["qwen3", "mxbai", "gemma"])
@pytest.mark.parametrize(
    ("query", "docs", "instruction"),
    [
        ("what is the capital of china?", ["the capital is beijing.", "no", "a b c\n\nd"], None),
        ("who are you?", ["me, of course"], "Find the person the query names"),
        (LONG, [LONG, "short"], None),  # the query past 3/4 of the budget, the pair past it
        ("short", [LONG], "an instruction"),
    ],
)
def test_prompt_ids_are_the_references(
    models: dict[str, Path], family: str, query: str, docs: list[str], instruction: str | None
) -> None:
    from transformers import AutoTokenizer

    model = resolve_model(ModelSpec(str(models[family])))
    processor = build_processor(model)
    tok = AutoTokenizer.from_pretrained(str(models[family]), padding_side="left")
    want = REFERENCE_INPUTS[family](tok, query, docs, instruction)
    got = processor.encode_pairs([(query, d) for d in docs], instruction=instruction)
    assert [t.ids for t in got] == want
    assert all(len(t.ids) <= processor.max_length for t in got)
    if LONG in (query, *docs):
        assert got[0].truncated_from is not None and got[0].truncated_from > len(got[0].ids)
        with pytest.raises(BadRequest, match="send truncate=true or shorten them"):
            processor.encode_pairs([(query, docs[0])], truncate=False)
    else:
        assert all(t.truncated_from is None for t in got)
        processor.encode_pairs([(query, d) for d in docs], truncate=False)


def test_a_model_instruction_is_used_unless_a_request_gives_one(
    models: dict[str, Path],
) -> None:
    from transformers import AutoTokenizer

    spec = ModelSpec(str(models["qwen3"]), instruction="Judge code")
    processor = build_processor(resolve_model(spec))
    tok = AutoTokenizer.from_pretrained(str(models["qwen3"]), padding_side="left")
    pair = [("q", "d")]
    assert [t.ids for t in processor.encode_pairs(pair)] == REFERENCE_INPUTS["qwen3"](
        tok, "q", ["d"], "Judge code"
    )
    assert [t.ids for t in processor.encode_pairs(pair, instruction="x")] == REFERENCE_INPUTS[
        "qwen3"
    ](tok, "q", ["d"], "x")


def test_a_hub_cache_path_names_the_family(models: dict[str, Path], tmp_path: Path) -> None:
    snapshot = tmp_path / "models--Qwen--Qwen3-Reranker-4B" / "snapshots" / "0123abcd"
    shutil.copytree(models["qwen3"], snapshot)
    model = resolve_model(ModelSpec(str(snapshot)))
    assert isinstance(model.facts, LlmReranker) and model.facts.template.name == "qwen3-reranker"


def test_an_unnamed_causal_lm_is_refused_with_both_ways_to_serve_it(
    models: dict[str, Path], tmp_path: Path
) -> None:
    path = _renamed(models["qwen3"], tmp_path, "my-model")
    with pytest.raises(ConfigError) as refused:
        resolve_model(ModelSpec(str(path), served_model_name="mine"))
    assert str(refused.value) == (
        "mine is a Qwen3ForCausalLM without a sentence-transformers pooling config: an LLM "
        "reranker or a decoder its files do not say; pass --task rerank to serve it as "
        "qwen3-reranker (Qwen/Qwen3-Reranker-0.6B's template), or --pooling last to embed "
        "with it"
    )
    ranked = resolve_model(ModelSpec(str(path), task="rerank"))
    assert isinstance(ranked.facts, LlmReranker) and ranked.facts.template.name == "qwen3-reranker"
    embedder = resolve_model(ModelSpec(str(path), pooling="last"))
    assert embedder.family is by_name("dense") and not isinstance(embedder.facts, LlmReranker)


def test_a_named_reranker_embeds_when_asked(models: dict[str, Path]) -> None:
    model = resolve_model(ModelSpec(str(models["mxbai"]), pooling="last"))
    assert model.family is by_name("dense") and not isinstance(model.facts, LlmReranker)
    with pytest.raises(ConfigError, match="pass --pooling cls"):
        resolve_model(ModelSpec(str(models["gemma"]), task="embed"))


def test_a_decoder_embedder_with_a_pooling_config_stays_one(tmp_path: Path) -> None:
    """Qwen3-Embedding's config.json names Qwen3ForCausalLM too; its pipeline pools."""
    path = build_tiny_decoder_embedder(tmp_path / "Qwen3-Reranker-look-alike-Embedding")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    model = resolve_model(ModelSpec(str(path)))
    assert model.family is by_name("dense") and not isinstance(model.facts, LlmReranker)


def test_task_rerank_on_a_causal_lm_without_a_template_is_refused(
    models: dict[str, Path], tmp_path: Path
) -> None:
    path = _renamed(models["qwen3"], tmp_path, "llama-reranker")
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as refused:
        resolve_model(ModelSpec(str(path), task="rerank"))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--task rerank: ") and "has no reranker template" in message
    assert "Qwen3ForCausalLM (qwen3-reranker)" in message
    assert "GemmaForCausalLM (bge-reranker-v2-gemma)" in message


def test_answer_tokens_must_be_single_tokens(models: dict[str, Path]) -> None:
    family = replace(TEMPLATES[0], positive="the capital city")
    with pytest.raises(ConfigError, match=r"encodes 'the capital city' as [0-9]+ tokens"):
        answer_token_ids(family, models["qwen3"])


@pytest.mark.parametrize(
    "options",
    [{}, {"device": "cpu"}, {"dtype": "float32"}, {"dtype": "bfloat16"}, {"device": "cuda"}],
)
def test_auto_serves_them_on_torch(models: dict[str, Path], options: dict) -> None:
    for path in models.values():
        model = resolve_model(ModelSpec(str(path), **options))
        for accelerator in (None, "cuda"):
            assert choose_backend(model, accelerator).backend == "torch"


def test_auto_int8_on_a_cpu_is_onnx_as_for_every_model(models: dict[str, Path]) -> None:
    model = resolve_model(ModelSpec(str(models["qwen3"]), dtype="int8"))
    assert choose_backend(model, None).backend == "onnx"  # the only int8 path that runs it
    assert choose_backend(model, "cuda").backend == "torch"  # which then refuses int8


def test_ct2_and_neuron_refuse_them_in_one_line(models: dict[str, Path]) -> None:
    model = resolve_model(ModelSpec(str(models["gemma"]), backend="ct2"))
    with pytest.raises(ConfigError) as ct2:
        ct2_backend.load(model)
    assert str(ct2.value) == (
        f"model {model.served_name!r} is a decoder, GemmaForCausalLM (gemma): ct2 runs "
        "encoders (bert, distilbert, roberta, xlm-roberta, camembert); use --backend torch "
        "or onnx"
    )
    model = resolve_model(ModelSpec(str(models["qwen3"]), served_model_name="q", backend="neuron"))
    with pytest.raises(ConfigError) as neuron:
        compile_options(model)
    assert str(neuron.value) == (
        "model 'q' is an LLM reranker (qwen3-reranker, Qwen3ForCausalLM): the neuron backend "
        "compiles encoders and sequence classifiers; use --backend torch or onnx"
    )


def test_only_instructed_kinds_take_an_instruction() -> None:
    by_name("llm-reranker").require_instruction("m")
    for name in ("cross-encoder", "colbert", "dense"):
        with pytest.raises(BadRequest, match=r"takes no instruction") as refused:
            by_name(name).require_instruction("m")
        assert refused.value.param == "instruction"
