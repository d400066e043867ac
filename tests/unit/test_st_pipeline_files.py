"""Reading sentence-transformers pipeline files (both Pooling formats, Dense, Normalize) and
the numpy pooling that serves them, against sentence-transformers' own Pooling module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec

ST6 = "sentence_transformers."
POOLING6 = ST6 + "sentence_transformer.modules.pooling.Pooling"
DENSE6 = ST6 + "base.modules.dense.Dense"
NORMALIZE6 = ST6 + "base.modules.normalize.Normalize"


def pipeline_dir(
    root: Path, pooling: Any, *after: tuple[str, dict | None], raw_pooling: str | None = None
) -> Path:
    """A model directory with just the files resolution reads: config.json, modules.json,
    the Pooling config (``raw_pooling``: its text as is; None: no file) and each module
    after it as (type, config)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": ST6 + "base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING6},
    ]
    (root / "1_Pooling").mkdir()
    if raw_pooling is not None or pooling is not None:
        text = raw_pooling if raw_pooling is not None else json.dumps(pooling)
        (root / "1_Pooling" / "config.json").write_text(text)
    for idx, (kind, cfg) in enumerate(after, start=2):
        path = f"{idx}_{kind.rsplit('.', 1)[-1]}"
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": kind})
        (root / path).mkdir()
        if cfg is not None:
            (root / path / "config.json").write_text(json.dumps(cfg))
    (root / "modules.json").write_text(json.dumps(modules))
    return root


@pytest.mark.parametrize(
    ("pooling", "modes", "width", "include_prompt"),
    [
        # what sentence-transformers 6 writes (the example file)
        ({"pooling_mode": "cls", "embedding_dimension": 64}, ("cls",), 64, True),
        (
            {"pooling_mode": ["lasttoken", "mean"], "embedding_dimension": 8,
             "include_prompt": False},
            ("last", "mean"), 16, False,
        ),
        ({"pooling_mode": "mean_sqrt_len_tokens", "embedding_dimension": 8},
         ("mean_sqrt_len",), 8, True),
        # 5.x booleans: concatenated in the key order sentence-transformers uses
        (
            {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True,
             "pooling_mode_cls_token": True, "pooling_mode_weightedmean_tokens": True,
             "include_prompt": False},
            ("cls", "mean", "weightedmean"), 24, False,
        ),
        # 5.x keys all false: mean, as sentence-transformers 6 reads such a file
        ({"word_embedding_dimension": 8, "pooling_mode_cls_token": False}, ("mean",), 8, True),
    ],
)  # fmt: skip
def test_both_pooling_formats(
    tmp_path: Path, pooling: dict, modes: tuple, width: int, include_prompt: bool
) -> None:
    model = resolve_model(ModelSpec(str(pipeline_dir(tmp_path / "m", pooling))))
    assert (model.poolings, model.hidden_size) == (modes, width)
    assert (model.pooling, model.include_prompt, model.normalize) == (
        modes[0],
        include_prompt,
        False,
    )


def test_six_module_paths_and_normalize(tmp_path: Path) -> None:
    pooling = {"pooling_mode": "mean", "embedding_dimension": 8}
    root = pipeline_dir(tmp_path / "m", pooling, (NORMALIZE6, {}))
    assert resolve_model(ModelSpec(str(root))).normalize is True


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"embedding_dimension": null, "foo": 1}', "exists but holds no pooling mode"),
        ("{not json", "not valid JSON"),
        ('["cls"]', "not a Pooling config"),
        ('{"pooling_mode": "median", "embedding_dimension": 8}', "'median' is not one of"),
        ('{"pooling_mode": [], "embedding_dimension": 8}', "names no mode"),
        (None, "1_Pooling/config.json is missing"),
    ],
)
def test_a_pooling_file_that_cannot_be_read_says_so(
    tmp_path: Path, raw: str | None, message: str
) -> None:
    root = pipeline_dir(tmp_path / "m", None, raw_pooling=raw)
    with pytest.raises(ConfigError, match=message):
        resolve_model(ModelSpec(str(root)))


def _dense(**extra: Any) -> dict:
    return {
        "in_features": 8,
        "out_features": 4,
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
        **extra,
    }


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ([(DENSE6, _dense(activation_function="torch.nn.modules.activation.GELU"))], "GELU"),
        ([(DENSE6, _dense(activation_function="my_pkg.Swish"))], "my_pkg.Swish"),
        ([(DENSE6, _dense(module_input_name="token_embeddings"))], "token_embeddings"),
        ([(DENSE6, _dense(in_features=16))], "takes 16 features but 8 come before it"),
        ([(DENSE6, _dense()), (DENSE6, _dense())], "takes 8 features but 4 come before it"),
        ([(NORMALIZE6, {}), (DENSE6, _dense())], "after Normalize"),
        ([(DENSE6, None)], "2_Dense/config.json is missing"),
    ],
)
def test_dense_modules_ember_cannot_serve_are_refused(
    tmp_path: Path, after: list, message: str
) -> None:
    pooling = {"pooling_mode": "mean", "embedding_dimension": 8}
    root = pipeline_dir(tmp_path / "m", pooling, *after)
    with pytest.raises(ConfigError, match=message):
        resolve_model(ModelSpec(str(root)))


def test_dense_weights_must_fit_their_config(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from ember.heads.build import build_heads

    pooling = {"pooling_mode": "mean", "embedding_dimension": 8}
    root = pipeline_dir(tmp_path / "m", pooling, (DENSE6, _dense()), (NORMALIZE6, {}))
    weights = {"linear.weight": np.ones((4, 6), np.float32), "linear.bias": np.ones(4, np.float32)}
    save_file(weights, str(root / "2_Dense" / "model.safetensors"))
    model = resolve_model(ModelSpec(str(root)))
    assert (model.hidden_size, model.normalize) == (4, True)
    with pytest.raises(ConfigError, match=r"linear.weight is \(4, 6\).*\(4, 8\)"):
        build_heads(model)
    save_file(
        {"linear.weight": np.ones((4, 8), np.float32)}, str(root / "2_Dense/model.safetensors")
    )
    with pytest.raises(ConfigError, match="bias True in the config, not in the weights"):
        build_heads(model)


# ------------------------------------------------- numpy pooling vs sentence-transformers


MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
EMBER = {"mean_sqrt_len_tokens": "mean_sqrt_len", "lasttoken": "last"}


@pytest.mark.parametrize("prompt_length", [0, 3, 9], ids=["all", "prompt", "prompt-is-all"])
@pytest.mark.parametrize("mode", [*MODES, MODES[::-1]], ids=[*MODES, "all-reversed"])
def test_pooling_matches_sentence_transformers(mode: Any, prompt_length: int) -> None:
    """Random right-padded states: each mode (and all of them, concatenated), with the
    first ``prompt_length`` positions left out as include_prompt false does, against
    sentence-transformers' Pooling on the same arrays. 9 covers rows that are all prompt."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling

    from ember.heads.pooling import pool_modes

    rng = np.random.default_rng(0)
    lengths = np.array([12, 9, 5, 1])
    hidden = rng.normal(size=(4, 12, 8)).astype(np.float32)
    mask = (np.arange(12)[None, :] < lengths[:, None]).astype(np.int64)
    st = Pooling(8, pooling_mode=mode, include_prompt=prompt_length == 0)
    features = {
        "token_embeddings": torch.from_numpy(hidden),
        "attention_mask": torch.from_numpy(mask),
    }
    if prompt_length:
        features["prompt_length"] = prompt_length
    want = st(features)["sentence_embedding"].numpy()
    modes = tuple(EMBER.get(m, m) for m in ((mode,) if isinstance(mode, str) else mode))
    skip = np.full(4, prompt_length) if prompt_length else None
    np.testing.assert_allclose(pool_modes(hidden, mask, modes, skip), want, rtol=1e-5, atol=1e-6)


def test_rows_keep_their_own_prompt_in_one_batch() -> None:
    """A batch mixing prompted and plain rows pools each as it would alone."""
    from ember.heads.pooling import pool_modes

    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(3, 10, 8)).astype(np.float32)
    mask = np.ones((3, 10), np.int64)
    skip = np.array([4, 0, 2])
    modes = ("cls", "weightedmean", "last")
    together = pool_modes(hidden, mask, modes, skip)
    for row in range(3):
        alone = pool_modes(hidden[row : row + 1], mask[row : row + 1], modes, skip[row : row + 1])
        np.testing.assert_allclose(together[row], alone[0], rtol=1e-6)
    assert not np.allclose(together[0], pool_modes(hidden[:1], mask[:1], modes)[0])
