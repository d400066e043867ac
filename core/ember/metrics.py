"""Prometheus metrics, one registry per served app (tests build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ember_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "ember_request_seconds",
            "Seconds from a request reaching the app to its response sent, by route and status",
            ["route", "status"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "ember_queue_depth",
            "Inputs admitted and not yet answered whose request has not ended",
            ["model"],
            registry=r,
        )
        self.batch_size = Histogram(
            "ember_batch_size",
            "Texts per forward pass",
            ["model"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "ember_batch_tokens",
            "Padded tokens per forward pass",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "ember_stage_seconds",
            "Time per request stage (tokenize, queue, forward, serialize)",
            ["model", "stage"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        # Priority lanes (ember.lanes): what each lane has waiting, how long its inputs
        # waited, and the tokens forwarded for it (rate(): its tokens/s).
        self.lane_queued_tokens = Gauge(
            "ember_lane_queued_tokens",
            "Tokens (cost) of the inputs queued in each lane, not yet in a forward pass",
            ["model", "lane"],
            registry=r,
        )
        self.lane_wait_seconds = Histogram(
            "ember_lane_wait_seconds",
            "Seconds an input waited in its lane's queue before its batch was formed",
            ["model", "lane"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.lane_tokens = Counter(
            "ember_lane_tokens",
            "Tokens (real cost) forwarded per lane; its rate is the lane's tokens/s",
            ["model", "lane"],
            registry=r,
        )
        self.failed_batches = Counter(
            "ember_failed_batches", "Forward passes that raised", ["model"], registry=r
        )
        self.truncated_inputs = Counter(
            "ember_truncated_inputs",
            "Inputs cut to the model's maximum length (truncate or overflow 'truncate')",
            ["model"],
            registry=r,
        )
        self.rejected = Counter(
            "ember_rejected",
            "Requests refused at arrival: queue full, too large, or past their deadline",
            ["model"],
            registry=r,
        )
        # The embedding cache (ember.engine.cache, --cache-entries): counted per input.
        self.cache_hits = Counter(
            "ember_cache_hits", "Inputs answered from the embedding cache", ["model"], registry=r
        )
        self.cache_misses = Counter(
            "ember_cache_misses",
            "Inputs looked up in the embedding cache, not found and computed (merged misses "
            "are ember_cache_merged)",
            ["model"],
            registry=r,
        )
        self.cache_merged = Counter(
            "ember_cache_merged",
            "Inputs that missed the embedding cache while the same input was being computed "
            "(for another request, or earlier in the same one) and took that result instead "
            "of computing it again",
            ["model"],
            registry=r,
        )
        self.cache_evictions = Counter(
            "ember_cache_evictions",
            "Entries the embedding cache dropped, least recently used first, to stay within "
            "--cache-entries and --cache-max-bytes",
            registry=r,
        )
        self.cache_bytes = Gauge(
            "ember_cache_bytes",
            "Bytes the embedding cache holds (vectors, keys and a fixed per-entry overhead)",
            registry=r,
        )
        self.cache_entries = Gauge(
            "ember_cache_entries", "Entries the embedding cache holds", registry=r
        )
        # Per API key (--api-keys-file; --api-key is the key named "--api-key").
        self.key_requests = Counter(
            "ember_key_requests",
            "Requests by API key name and answer status (errors included)",
            ["key", "status"],
            registry=r,
        )
        self.key_inputs = Counter(
            "ember_key_inputs",
            "Inputs the engine served per API key (texts, images, rerank documents; cache hits "
            "included)",
            ["key"],
            registry=r,
        )
        self.key_tokens = Counter(
            "ember_key_tokens", "Tokens of the inputs served per API key", ["key"], registry=r
        )
        self.key_rate_limited = Counter(
            "ember_key_rate_limited",
            "Requests refused with 429 by their API key's own limit, by key and limit",
            ["key", "limit"],
            registry=r,
        )
        self.key_in_flight = Gauge(
            "ember_key_in_flight", "Requests in flight per API key", ["key"], registry=r
        )
        # Models on demand (ember.engine.residency): loads, unloads, what each holds.
        self.model_loads = Counter(
            "ember_model_loads",
            "Model loads by model and outcome (ok, failed)",
            ["model", "outcome"],
            registry=r,
        )
        self.model_evictions = Counter(
            "ember_model_evictions",
            "Models unloaded, by model and reason: room (--max-loaded or --memory-budget), "
            "idle (idle_unload or keep_alive), admin (POST /models/unload)",
            ["model", "reason"],
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "ember_model_load_seconds",
            "Seconds a model took to load and warm up",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.model_resident_bytes = Gauge(
            "ember_model_resident_bytes",
            "Memory attributed to each loaded model (resident, with device memory; measured "
            "around its load); 0 when unloaded",
            ["model"],
            registry=r,
        )
