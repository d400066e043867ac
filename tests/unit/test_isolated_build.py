"""Artifact builds run in a child process, so a first start ends as light as a cached one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember.backends import isolated
from ember.errors import BackendFailure, ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec


class _TwoArgError(Exception):
    def __init__(self, message: str, value: object) -> None:
        super().__init__(message)  # args lose `value`: unpickling calls __init__(message)
        self.value = value


@pytest.fixture()
def as_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process has torch imported; a server process has not."""
    monkeypatch.setattr(isolated, "worth_a_child", lambda: True)


def test_not_worth_a_child_once_torch_is_imported() -> None:
    import torch  # noqa: F401

    assert not isolated.worth_a_child()
    assert isolated.run(os.getpid) == os.getpid()


@pytest.mark.usefixtures("as_a_server")
def test_runs_in_another_process_and_returns_the_value() -> None:
    assert isolated.run(os.getpid) != os.getpid()
    assert isolated.run(sorted, [3, 1, 2]) == [1, 2, 3]


@pytest.mark.usefixtures("as_a_server")
def test_the_childs_error_is_raised_here_with_its_type(tmp_path: Path) -> None:
    """A library function, not one of this module's: the child imports it by name."""
    with pytest.raises(ConfigError, match=str(tmp_path)):
        isolated.run(resolve_model, ModelSpec(model_id=str(tmp_path)))


def test_an_error_that_does_not_unpickle_keeps_its_type_and_message() -> None:
    portable = isolated._portable(_TwoArgError("trace failed", object()))
    assert isinstance(portable, BackendFailure)
    assert str(portable) == "_TwoArgError: trace failed"
    config_error = ConfigError("kept as is")
    assert isolated._portable(config_error) is config_error


@pytest.mark.usefixtures("as_a_server")
def test_a_child_that_dies_is_a_clear_failure() -> None:
    with pytest.raises(BackendFailure, match="exited with status 3 and no result"):
        isolated.run(os._exit, 3)


@pytest.mark.usefixtures("as_a_server")
def test_what_does_not_pickle_runs_here() -> None:
    here = os.getpid()
    assert isolated.run(lambda: os.getpid()) == here


_FIRST_LOAD = """
import json, sys
from ember.backends import load_backend
from ember.config import settings_from_env
from ember.families.resolve import resolve_model

(spec,) = settings_from_env(backend=sys.argv[1], device="cpu").model_specs()  # EMBER_CACHE_DIR
backend = load_backend(resolve_model(spec))
folder = str(backend.path).removesuffix("model.onnx").rstrip("/")
json.load(open(folder + "/ember_artifact.json"))  # the manifest a finished build writes
print(json.dumps({"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                  "backend": backend.info.name, "folder": folder}))
"""


@pytest.mark.parametrize("backend", ["onnx", "ct2"])
def test_a_first_load_never_imports_torch_in_the_serving_process(
    tmp_path: Path, backend: str
) -> None:
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_LOAD, backend],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["backend"] == backend
    # built by this load: its artifact lies in the cache directory the test made empty
    assert Path(facts["folder"]).is_relative_to(tmp_path), facts
    assert not facts["torch"] and not facts["transformers"], facts
