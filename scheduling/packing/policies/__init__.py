"""The packing policies, one module each: FGD and the five baselines of the FGD paper (Weng et al., USENIX ATC'23).
Each module's docstring gives its node score and GPU-device rule; ``scheduling.packing.registry`` maps names to them.
"""
from scheduling.packing.policies.bestfit import BestFit
from scheduling.packing.policies.dotprod import DotProd
from scheduling.packing.policies.fgd import FGD
from scheduling.packing.policies.gpu_clustering import GpuClustering
from scheduling.packing.policies.gpu_packing import GpuPacking
from scheduling.packing.policies.random_fit import RandomFit

__all__ = ["FGD", "BestFit", "DotProd", "GpuClustering", "GpuPacking", "RandomFit"]
