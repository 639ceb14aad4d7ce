"""Simulation: cost model, memory model, analytic and SimPy fidelities, results, config, CLI."""

__version__ = "0.1.0"
