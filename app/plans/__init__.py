"""Plans (``POST /v1/plans``): will a model's step fit these GPUs, predicted, nothing run."""
