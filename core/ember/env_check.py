"""Variables that look meant for Ember but set nothing, named once at start.

With no model given Ember serves its packaged MiniLM, so a misspelt ``EMBER_MODLE_ID`` or a
TEI deployment's ``MODEL_ID`` would otherwise serve the wrong model without a word. Read
by ``ember.config.settings_from_env``, whose warnings the server logs at start.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ember.config_values import env_var
from ember.tei_options import TEI_BY_ENV

# EMBER_* names read outside the settings: each platform adapter's own knobs
# (ember.config.ember_env(platform=...)), and the test suite's, examples' and benchmarks'.
PLATFORM_PREFIXES = ("EMBER_BENTOML_", "EMBER_MODAL_", "EMBER_RUNPOD_", "EMBER_SAGEMAKER_")
TOOLING_VARIABLES = frozenset(
    {
        "EMBER_CONFORMANCE_DEVICE",
        "EMBER_IMAGE_CACHE",
        "EMBER_REQUIRE_IMAGES",
        "EMBER_TEST_CPU_EMULATOR",
        "EMBER_URL",
    }
)
# TEI's variables that other software sets for its own reasons (a container's HOSTNAME),
# that `ember serve` honours itself (PORT), or that the hub client reads anyway.
TEI_SHARED = frozenset({"HOSTNAME", "PORT", "HF_TOKEN", "HUGGINGFACE_HUB_CACHE"})


def environment_notes(
    environ: Mapping[str, str], settings: Iterable[str], command: str = "serve"
) -> list[str]:
    """One line per variable that sets nothing under ``ember <command>``: an unknown
    ``EMBER_*`` name (with the nearest setting's variable), and, outside ``ember tei``,
    each of TEI's own variables (with what reads it)."""
    known = sorted(env_var(name) for name in settings)
    notes = []
    for key in sorted(environ):
        name = key.upper()
        if name.startswith("EMBER_"):
            if name in known or name in TOOLING_VARIABLES or name.startswith(PLATFORM_PREFIXES):
                continue
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            hint = f"did you mean {near[0]}?" if near else "`ember serve --help` lists them"
            notes.append(f"{key} is not a setting Ember reads ({hint}); it sets nothing")
        elif command != "tei" and name not in TEI_SHARED and environ[key].strip():
            option = TEI_BY_ENV.get(name)
            if option is None:
                continue
            ours = f"it reads {env_var(option.setting)}" if option.setting else "no such setting"
            notes.append(
                f"{key} is text-embeddings-router's variable, read by `ember tei`; "
                f"`ember {command}` ignores it ({ours})"
            )
    return notes
