"""Validation: microbenchmarks, calibration fits and the published-results suite."""
