"""Calibration: import of published measurement tables, profile fitting and accuracy reports."""
