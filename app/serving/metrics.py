"""Prometheus metrics, one registry per app so several apps can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_depth = Gauge("headscope_queue_depth", "Requests waiting for the worker", registry=r)
        self.batch_size = Histogram(
            "headscope_batch_size",
            "Images per forward pass",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=r,
        )
        self.compute_seconds = Histogram(
            "headscope_compute_seconds", "Forward pass + capture time per batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.request_seconds = Histogram(
            "headscope_request_seconds", "Attention request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.requests = Counter(
            "headscope_requests", "Attention requests by outcome", ["endpoint", "status"], registry=r
        )
        self.rejections = Counter("headscope_rejections", "Requests refused before compute", ["reason"], registry=r)
        self.errors = Counter("headscope_errors", "Failed computations", ["kind"], registry=r)
        self.oom_splits = Counter("headscope_oom_splits", "Batches split after out-of-memory", registry=r)
        self.cache_bytes = Gauge("headscope_cache_bytes", "Bytes held by the results cache", registry=r)
        self.cache_entries = Gauge("headscope_cache_entries", "Entries in the results cache", registry=r)
        self.cache_hits = Counter("headscope_cache_hits", "Follow-up queries answered from the cache", registry=r)
        # admission (app/serving/admission.py)
        self.admitted = Gauge("headscope_admitted", "Requests holding a slot, by pool", ["pool"], registry=r)
        self.decode_bytes = Gauge(
            "headscope_decode_reserved_bytes", "Estimated peak memory of the decodes in progress", registry=r
        )
        self.shared_computes = Counter(
            "headscope_shared_computes", "Uploads answered from an identical upload's computation in flight", registry=r
        )
        # app/web/log_writer.py
        self.log_records_dropped = Counter(
            "headscope_log_records_dropped",
            "Log records dropped because the log's reader did not read them in time (a full pipe)",
            registry=r,
        )
