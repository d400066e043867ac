"""Models on demand, the decisions alone (``ember.engine.residency``): which models make
room for a load, which never can, which have been idle too long; and the catalogue's
values (``ember.models.catalogue``). No engine, no clock: slots and numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.config import ServerSettings
from ember.engine.residency import Slot, expired, make_room, never_fits
from ember.errors import ConfigError
from ember.models.catalogue import (
    Residence,
    ResidencyLimits,
    duration_seconds,
    parse_bytes,
    read_models_file,
    weight_bytes,
)
from ember.models.spec import ModelSpec

UNPINNED = Residence(pin=False, eager=False, idle_unload=60.0)


def _slot(name: str, *, bytes_: int = 100, used_at: float = 0.0, **state: object) -> Slot:
    residence = state.pop("residence", UNPINNED)
    slot = Slot(ModelSpec(model_id=name, served_model_name=name), residence, engine=None)  # type: ignore[arg-type]
    slot.status, slot.memory_bytes, slot.used_at = "loaded", bytes_, used_at
    for key, value in state.items():
        setattr(slot, key, value)
    return slot


def test_room_goes_least_recently_used_first_and_only_as_much_as_needed() -> None:
    old, mid, new = _slot("old", used_at=1), _slot("mid", used_at=2), _slot("new", used_at=3)
    target = _slot("target", status="unloaded", bytes_=0)
    slots = [new, old, mid, target]
    assert make_room(slots, target, 100, ResidencyLimits(memory_budget=300)) == [old]
    assert make_room(slots, target, 200, ResidencyLimits(memory_budget=300)) == [old, mid]
    assert make_room(slots, target, 100, ResidencyLimits(max_loaded=3)) == [old]
    assert make_room(slots, target, 100, ResidencyLimits()) == []


def test_pinned_busy_and_loading_models_are_never_evicted() -> None:
    pinned = _slot("pinned", used_at=0, residence=Residence())
    busy = _slot("busy", used_at=1, in_flight=1)
    loading = _slot("loading", used_at=2, status="loading")
    idle = _slot("idle", used_at=9)
    target = _slot("target", status="unloaded", bytes_=0)
    slots = [pinned, busy, loading, idle, target]
    assert make_room(slots, target, 100, ResidencyLimits(memory_budget=400)) == [idle]
    # room only the busy one could give: not now (the load waits for it to go idle)
    assert make_room(slots, target, 200, ResidencyLimits(memory_budget=400)) is None
    assert never_fits(slots, target, 200, ResidencyLimits(memory_budget=400)) is None
    # which to drain then: the busy one, never the pinned or the loading one
    drain = make_room(slots, target, 200, ResidencyLimits(memory_budget=400), busy=True)
    assert drain == [busy, idle]


def test_never_fits_counts_the_pinned_models_only() -> None:
    pinned = _slot("pinned", bytes_=300, residence=Residence())
    other = _slot("other", bytes_=300)
    target = _slot("target", status="unloaded", bytes_=0)
    reason = never_fits([pinned, other, target], target, 101, ResidencyLimits(memory_budget=400))
    assert reason is not None and "--memory-budget leaves 100" in reason
    assert (
        never_fits([pinned, other, target], target, 100, ResidencyLimits(memory_budget=400)) is None
    )
    full = never_fits([pinned, target], target, 1, ResidencyLimits(max_loaded=1))
    assert full is not None and "--max-loaded 1" in full


def test_idle_deadlines_follow_keep_alive_then_idle_unload() -> None:
    plain = _slot("plain", used_at=0)  # idle_unload 60
    kept = _slot("kept", used_at=0, keep_alive=300.0)
    dropped = _slot("dropped", used_at=0, keep_alive=0.0)
    forever = _slot("forever", used_at=0, keep_alive=-1.0)
    pinned = _slot("pinned", used_at=0, residence=Residence(), keep_alive=0.0)
    busy = _slot("busy", used_at=0, keep_alive=0.0, in_flight=1)
    slots = [plain, kept, dropped, forever, pinned, busy]
    assert expired(slots, 0.0) == [dropped]
    assert expired(slots, 60.0) == [plain, dropped]
    assert expired(slots, 10_000.0) == [plain, kept, dropped]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), ("30", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("-1", -1.0), ("250ms", 0.25)],
)
def test_durations_read_as_ollama_reads_keep_alive(value: object, seconds: float) -> None:
    assert duration_seconds(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["5y", "", "m", "1h 30m", True])
def test_what_is_no_duration_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        duration_seconds(value)  # type: ignore[arg-type]


def test_sizes() -> None:
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5G") == int(1.5 * 10**9)
    assert parse_bytes("1000") == 1000
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_weight_bytes_counts_one_format(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "model.onnx").write_bytes(b"x" * 200)
    assert weight_bytes(tmp_path) == 300
    assert weight_bytes(tmp_path / "missing") == 0


def test_the_models_file_and_the_flags_given_once(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "models.toml").write_text(
        '[models.small]\nmodel_id = "local"\npin = true\nload = "eager"\n'
        '[models.hub]\nmodel_id = "org/model"\nidle_unload = "10m"\nbackend = "torch"\n'
    )
    settings = ServerSettings(models_file=str(tmp_path / "models.toml"), dtype="float32")
    served = settings.catalogue()
    assert [(s.served_model_name, s.model_id) for s, _ in served] == [
        ("small", str(tmp_path / "local")),
        ("hub", "org/model"),
    ]
    assert served[0][1] == Residence(pin=True, eager=True, idle_unload=None)
    assert served[1][1] == Residence(pin=False, eager=False, idle_unload=600.0)
    assert served[1][0].backend == "torch" and served[1][0].dtype == "float32"


def test_a_bad_models_file_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models.x]\nmodel_id = "a"\npinned = true\n')
    with pytest.raises(ConfigError, match="unknown keys \\['pinned'\\]"):
        read_models_file(path, None, ("model_id",))
    path.write_text('[models.x]\nload = "sometimes"\n')
    with pytest.raises(ConfigError, match="load must be eager or lazy"):
        read_models_file(path, None, ("model_id",))
