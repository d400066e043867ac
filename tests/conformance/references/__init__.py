"""One reference module per registry family (``ember.families.registry.FAMILIES``), named after it
(``llm-cross-encoder`` -> ``llm_cross_encoder.py``). Each says which family and example it
stands for and how to build and check it; README.md in the folder above has the contract.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def module_name(family: str) -> str:
    """The module a family's reference lives in."""
    return family.replace("-", "_")


def modules() -> dict[str, ModuleType]:
    """Every reference module in this package, by module name."""
    return {
        info.name: importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
    }
