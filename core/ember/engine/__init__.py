"""Engines (async, one per model), their router, and the blocking facade."""

from ember.engine.array import EngineArray
from ember.engine.engine import Engine
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.engine.result import Result, Timings
from ember.engine.sync import SyncEngineArray

__all__ = [
    "ClassifyRequest",
    "EmbedRequest",
    "Engine",
    "EngineArray",
    "RerankRequest",
    "Result",
    "SyncEngineArray",
    "Timings",
]
