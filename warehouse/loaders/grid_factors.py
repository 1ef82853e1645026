"""Emission factors for the grid loaders, and carbon intensity recomputed from a generation mix.

Factors in gCO2eq/kWh. `CARBONCAST_DIRECT` / `CARBONCAST_LIFECYCLE` are the CarbonCast factors that the
EnsembleCI/CarbonCast files were built with: `DATA_DIR/grid/SOURCE.md` identified them by exact regression on
the files (RMSE 0.00), and `tests/warehouse/test_loaders_grid.py` re-checks that. `LWA_*` are the IPCC SRREN
medians and per-country import factors that the Let's-Wait-Awhile repository used for `gb_ci.csv`
(lifecycle, consumption-weighted: imports included, pumped storage excluded).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

# The contract's fuel names (docs/data-contracts.md, raw.grid_generation.fuel).
FUELS: tuple[str, ...] = (
    "coal",
    "nat_gas",
    "nuclear",
    "oil",
    "hydro",
    "solar",
    "wind",
    "other",
    "unknown",
    "biomass",
    "geothermal",
)

CARBONCAST_DIRECT: dict[str, float] = {
    "coal": 760.0,
    "nat_gas": 370.0,
    "oil": 406.0,
    "other": 575.0,
    "unknown": 575.0,
    "nuclear": 0.0,
    "hydro": 0.0,
    "solar": 0.0,
    "wind": 0.0,
    "biomass": 0.0,
    "geothermal": 0.0,
}

# SE's lifecycle file fits "unknown" at about 293 instead of 700 (SOURCE.md); we never recompute SE lifecycle.
CARBONCAST_LIFECYCLE: dict[str, float] = {
    "coal": 820.0,
    "nat_gas": 490.0,
    "oil": 650.0,
    "other": 700.0,
    "unknown": 700.0,
    "nuclear": 12.0,
    "hydro": 24.0,
    "solar": 45.0,
    "wind": 11.0,
    "biomass": 230.0,
    "geothermal": 38.0,
}

# lets-wait-awhile (gb_ci.csv): IPCC SRREN medians per ENTSO-E production type, and per-country import factors.
LWA_PRODUCTION_LIFECYCLE: dict[str, float] = {
    "Biomass": 18.0,
    "Fossil Gas": 469.0,
    "Fossil Hard coal": 1001.0,
    "Fossil Oil": 840.0,
    "Hydro Run-of-river and poundage": 4.0,
    "Nuclear": 16.0,
    "Other": 770.0,
    "Solar": 46.0,
    "Wind Offshore": 12.0,
    "Wind Onshore": 12.0,
}
LWA_IMPORT_LIFECYCLE: dict[str, float] = {"FR": 39.0, "NL": 452.0, "IE": 348.0, "BE": 153.0}


def intensity_from_mix(mix: pd.DataFrame, factors: Mapping[str, float]) -> pd.Series:
    """Production-based average intensity Σ genᵢ·EFᵢ / Σ genᵢ for a wide frame of generation columns.

    Scale-free (a mix reported ×4 gives the same intensity). NaN where the total generation is 0 or missing.
    Raises KeyError naming any column without a factor.
    """
    unknown = [c for c in mix.columns if c not in factors]
    if unknown:
        raise KeyError(f"no emission factor for {unknown}")
    values = mix.to_numpy(dtype="float64")
    weights = np.array([factors[c] for c in mix.columns], dtype="float64")
    total = values.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (values @ weights) / total
    result[~(total > 0)] = np.nan
    return pd.Series(result, index=mix.index, dtype="float64")
