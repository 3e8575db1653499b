"""Evaluation: datasets, metrics, runs that resume, threshold calibration and sweeps, reports."""
