"""Which optional packages are installed, found without importing them (``find_spec``), so
asking costs nothing on the path it decides: read by the backend chooser, the ONNX graph
builder and the loader's fallback."""

from __future__ import annotations

from importlib.util import find_spec


def installed(name: str) -> bool:
    """Whether ``name`` can be found, without importing it. A finder that refuses the name
    (an environment that blocks a package, as the torch-free tests do) counts as absent."""
    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def torch_installed() -> bool:
    """torch and transformers both: the torch backend and the ONNX exporter need them."""
    return installed("torch") and installed("transformers")
