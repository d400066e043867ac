"""Models whose ``config.json`` names classes in their own code (``auto_map``).

transformers runs that code only with ``trust_remote_code``; without it, a model whose
``model_type`` transformers also knows (jina-embeddings-v2 says ``bert``) loads the
built-in class instead, and its vectors are silently wrong (no ALiBi, no task adapters).
So Ember refuses such a model at start unless ``--trust-remote-code`` says to run its code.
"""

from __future__ import annotations

from typing import Any

from ember.errors import ConfigError

# The Auto classes Ember loads a text or media model through.
LOADED_THROUGH = (
    "AutoModel",
    "AutoModelForSequenceClassification",
    "AutoModelForMaskedLM",
    "AutoModelForCausalLM",
)


def own_code(config: dict[str, Any]) -> dict[str, str]:
    """Auto class -> ``module.Class`` the model's own code defines, for the classes Ember
    loads it through (``auto_map`` entries may also be ``repo--module.Class``)."""
    auto_map = config.get("auto_map") or {}
    found = {}
    for name in LOADED_THROUGH:
        target = auto_map.get(name)
        if isinstance(target, list | tuple):  # tokenizers list (slow, fast): not a model
            continue
        if target:
            found[name] = str(target)
    return found


def check_remote_code(config: dict[str, Any], served_name: str, trusted: bool) -> bool:
    """Whether the model runs its own code; a start-up refusal if it must and may not."""
    classes = own_code(config)
    if not classes or trusted:
        return bool(classes)
    where = ", ".join(f"{k} -> {v}" for k, v in classes.items())
    raise ConfigError(
        f"model {served_name!r} ships its own model code ({where}); pass "
        "--trust-remote-code to run it (it executes Python from the model's files), or "
        "serve a model transformers implements itself"
    )
