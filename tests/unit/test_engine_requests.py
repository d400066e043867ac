"""Typed engine requests: validated once against the model, and their options the
embedding cache's key."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from ember.engine.requests import EmbedRequest
from ember.errors import BadRequest
from ember.families.registry import by_name


def model(family: str, prompts: dict[str, str] | None = None) -> SimpleNamespace:
    """What ``validated`` reads of a resolved model."""
    return SimpleNamespace(family=by_name(family), hidden_size=8, prompts=prompts or {})


def full_size(dimensions: int | None) -> int | None:
    return EmbedRequest(["a"], dimensions=dimensions).dimensions


def test_zero_dimensions_mean_the_full_size() -> None:
    assert full_size(0) is None and full_size(None) is None and full_size(4) == 4


def test_a_request_is_frozen_and_its_options_leave_the_inputs_out() -> None:
    request = EmbedRequest(["a"], dimensions=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.dimensions = 2  # type: ignore[misc]
    options = request.options()
    assert "inputs" not in options and options["dimensions"] == 4
    assert options == EmbedRequest(["b", "c"], dimensions=4).options()


def test_validated_resolves_the_output_and_the_sides_prompt() -> None:
    done = EmbedRequest(["a"], query=True).validated(model("dense", {"query": "q: "}), "m")
    assert done.output == "dense" and done.prompt_name == "query"
    plain = EmbedRequest(["a"], output="dense")
    assert plain.validated(model("dense"), "m") is plain  # nothing to resolve: no copy


@pytest.mark.parametrize(
    ("family", "request_", "param", "words"),
    [
        ("cross-encoder", EmbedRequest(["a"]), "model", "does not embed"),
        ("dense", EmbedRequest(["a"], output="sparse"), "model", "no sparse head"),
        ("splade", EmbedRequest(["a"], dimensions=2), "dimensions", "applies to dense"),
        ("dense", EmbedRequest(["a"], dimensions=9), "dimensions", "between 1 and 8"),
        ("dense", EmbedRequest(["a"], modality="image"), "modality", "does not take image"),
    ],
)
def test_what_the_model_cannot_do_is_refused(
    family: str, request_: EmbedRequest, param: str, words: str
) -> None:
    with pytest.raises(BadRequest, match=words) as refused:
        request_.validated(model(family), "m")
    assert refused.value.param == param


def test_the_options_are_every_field_but_the_inputs() -> None:
    names = {f.name for f in dataclasses.fields(EmbedRequest)} - {"inputs"}
    assert set(EmbedRequest(["a"]).options()) == names
