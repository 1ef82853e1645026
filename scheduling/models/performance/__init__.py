"""Performance / interference predictor.

Network 1 (`prior.PriorModel`): isolated throughput of a job on a GPU type, and the normalized throughput of a job
co-located with a partner, from job features + learnt job embeddings (trained on Gavel's simulation set).
Network 2 (`refiner.Refiner`): a learnt-kernel Gaussian process over a job's placements that corrects network 1
with observed runtime throughput (trained on the oracle measurement set), updated online.
`predictor.PerformancePredictor` bundles both (training in torch); `inference.PredictorRuntime` is its numpy
prediction side, which the planner loads from a registered artifact (`weights` reads the torch files).
"""
