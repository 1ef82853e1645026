"""Models of the jobs: the performance/interference predictor, the GPU power model and the measured data they
learn from."""
