"""Workloads: model architectures, op graphs, parallel plans, training jobs and request streams.

Hardware-agnostic: FLOPs, bytes and message sizes, never seconds.
"""
