"""Settings' names, and the parsing and range checks of their values, each refusal
naming its flag: what ``ember.config`` applies to every setting it resolves."""

from __future__ import annotations

from ember.backend_settings import normalize_buckets
from ember.errors import ConfigError

# Fields that take one value per served model.
PER_MODEL_FIELDS = (
    "model_id",
    "served_model_name",
    "task",
    "backend",
    "device",
    "dtype",
    "pooling",
    "embedding_dtype",
    "revision",
    "max_batch_tokens",
    "max_batch_size",
    "max_queue_size",
    "instruction",
)


def env_var(field_name: str) -> str:
    """The ``EMBER_*`` variable of a setting."""
    return f"EMBER_{field_name.upper()}"


def split_values(value: str | None) -> list[str]:
    if value is None:
        return []
    return [part.strip() for part in str(value).split(";") if part.strip()]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    value = value.lower()
    if value not in allowed:
        raise ConfigError(f"{flag(name)} must be one of {'|'.join(allowed)}, got {value!r}")
    return value


def at_least_one(name: str, number: int) -> int:
    if number < 1:
        raise ConfigError(f"{flag(name)} must be >= 1, got {number}")
    return number


def nice_level(name: str, number: int) -> int:
    if not 0 <= number <= 19:
        raise ConfigError(f"{flag(name)} must be 0-19, got {number}")
    return number


def buckets(name: str, value: str | None) -> tuple[int, ...] | None:
    """Comma-separated sequence lengths, sorted and checked; None when not given."""
    if not value or not value.strip():
        return None
    try:
        numbers = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag(name)} takes comma-separated integers, got {value!r}") from None
    try:
        return normalize_buckets(numbers)
    except ValueError as err:
        raise ConfigError(f"{flag(name)}: {err}") from None


def lane_weights(name: str, value: str) -> tuple[float, float, float]:
    """Three positive weights, interactive,default,bulk (``ember.engine.shares``)."""
    try:
        weights = tuple(float(x) for x in value.split(","))
    except ValueError:
        weights = ()
    if len(weights) != 3 or not all(w > 0 for w in weights):
        raise ConfigError(
            f"{flag(name)} takes three positive numbers, interactive,default,bulk (as 9,3,1), "
            f"got {value!r}"
        )
    return weights  # type: ignore[return-value]  # three, checked
