"""Training simulation: plans, memory model, analytic and SimPy executors."""
