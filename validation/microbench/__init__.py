"""GPU microbenchmark harness (``llmsim calibrate run``) and the measurement CSV schema."""
