"""Ember: serve embedding, reranking and classification models fast, anywhere."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ember")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.1.0"

__all__ = ["__version__"]
