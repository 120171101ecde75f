"""Real CUDA measurements: the harness (one case), the runner (one subprocess per case), provenance."""
