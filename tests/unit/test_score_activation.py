"""A CrossEncoder's saved activation_fn read as sentence-transformers 6.2 reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember.errors import ConfigError
from ember.models.score_activation import saved_activation


def _saved(root: Path, activation: str | None) -> Path:
    root.mkdir(exist_ok=True)
    st = {"activation_fn": activation} if activation else {}
    (root / "config_sentence_transformers.json").write_text(json.dumps(st))
    return root


def test_where_sentence_transformers_reads_it(tmp_path: Path) -> None:
    identity = "torch.nn.modules.linear.Identity"
    assert saved_activation(_saved(tmp_path / "a", identity), {}, False) == "none"
    assert saved_activation(_saved(tmp_path / "b", None), {}, False) == "sigmoid"
    in_config = {"sentence_transformers": {"activation_fn": identity}}
    assert saved_activation(_saved(tmp_path / "c", None), in_config, False) == "none"
    legacy = {"sbert_ce_default_activation_function": "torch.nn.Identity"}  # before 4.0
    assert saved_activation(_saved(tmp_path / "d", None), legacy, False) == "none"
    # The sentence-transformers file comes first, as CrossEncoder reads it.
    sigmoid = "torch.nn.modules.activation.Sigmoid"
    assert saved_activation(_saved(tmp_path / "e", sigmoid), in_config, False) == "sigmoid"


def test_an_activation_not_applied_here_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="activation_fn torch.nn.Tanh; Ember applies"):
        saved_activation(_saved(tmp_path / "tanh", "torch.nn.Tanh"), {}, False)


def test_an_untrusted_path_falls_back_as_sentence_transformers_does(tmp_path: Path) -> None:
    root = _saved(tmp_path / "code", "my_package.activations.Clamp")
    assert saved_activation(root, {}, False) == "sigmoid"
    with pytest.raises(ConfigError, match="my_package.activations.Clamp"):
        saved_activation(root, {}, True)  # trusted: it would run, and Ember cannot
