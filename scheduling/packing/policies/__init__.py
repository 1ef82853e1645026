"""The packing policies of the FGD paper (Weng et al., USENIX ATC'23), one module each; every module's docstring
gives the node score and the GPU-device rule, and ``scheduling.packing.registry`` maps the names to the classes.

===================  ==============  ==============================================================
module               policy          prefers
===================  ==============  ==============================================================
``fgd``              FGD             the least growth of GPU fragmentation against the workload
``bestfit``          BestFit         the least CPU and GPU left after placement
``dotprod``          DotProd         free resources least aligned with the request
``gpu_packing``      GpuPacking      shared devices, then used nodes, then idle nodes
``gpu_clustering``   GpuClustering   nodes running pods of the same GPU-affinity tag
``random_fit``       Random          a feasible node uniformly at random (seeded)
===================  ==============  ==============================================================
"""

from scheduling.packing.policies.bestfit import BestFit
from scheduling.packing.policies.dotprod import DotProd
from scheduling.packing.policies.fgd import FGD
from scheduling.packing.policies.gpu_clustering import GpuClustering
from scheduling.packing.policies.gpu_packing import GpuPacking
from scheduling.packing.policies.random_fit import RandomFit

__all__ = ["FGD", "BestFit", "DotProd", "GpuClustering", "GpuPacking", "RandomFit"]
