"""Serving simulation: replicas, schedulers, paged KV cache, router, metrics."""
