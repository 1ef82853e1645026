"""One real DE day through the live ENTSO-E path: the shared grid files' mix, written as the GL_MarketDocument
ENTSO-E would send, served locally, fetched by the connector, loaded into a tmp warehouse, and compared with the
files' direct intensity.

Caveats from DATA_DIR/grid/SOURCE.md that this test depends on:
* `ensembleci/DE_direct_emissions.csv` holds *lifecycle* CI in `carbon_intensity` (identical to the lifecycle
  file); the true direct CI of DE is DACF's actual `carbon_intensity` (`dacf/DE_..._direct.csv`, Jul–Dec 2021),
  which equals the file mix recomputed with the CarbonCast direct factors.
* DE source columns are the sum of four 15-minute MW readings (4 × the hourly mean): ÷4 gives MW, and the four
  quarter-hour points written here average to that hourly mean before rounding to whole MW, as ENTSO-E
  publishes them. Both intensities are production-based (imports ignored). Timestamps are UTC hour starts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.connectors.conftest import ENTSOE_PATH
from tests.connectors.entsoe_documents import DE_EIC, Series, gl_market_document
from warehouse.connectors.ingest import ingest_live
from warehouse.db import reader
from warehouse.loaders.grid_factors import CARBONCAST_DIRECT, intensity_from_mix

# a summer day, the day the clocks go back in Europe (UTC throughout, so nothing moves), a winter day
DAYS = ("2021-07-15", "2021-10-31", "2021-12-21")
# the file's source columns as the ENTSO-E production types the connector maps back onto them
FILE_PSR = {
    "biomass": "B01",
    "coal": "B02",
    "nat_gas": "B04",
    "geothermal": "B09",
    "hydro": "B11",
    "nuclear": "B14",
    "oil": "B06",
    "solar": "B16",
    "wind": "B19",
    "unknown": "B20",
}
QUARTER_OFFSETS = np.array([-1.5, -0.5, 0.5, 1.5])


def _read(path) -> pd.DataFrame:
    raw = pd.read_csv(path)
    raw.index = pd.to_datetime(raw["UTC time"].str.replace("+00:00", ""), utc=True)
    return raw


def _between(frame: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    return frame.loc[(frame.index >= start) & (frame.index < end)]


def _quarters(hourly: np.ndarray) -> list[float]:
    """Four 15-min MW points per hour whose mean is the hourly mean: a ramp along the neighbouring hours, flat
    where the ramp would go below zero; whole MW."""
    out: list[float] = []
    for h, mean in enumerate(hourly):
        before, after = hourly[max(h - 1, 0)], hourly[min(h + 1, len(hourly) - 1)]
        points = mean + QUARTER_OFFSETS * (after - before) / 8
        if (points < 0).any():
            points = np.full(4, mean)
        out.extend(float(round(p)) for p in points)
    return out


@pytest.mark.parametrize("day", DAYS)
def test_a_de_day_through_entsoe_matches_the_files_direct_intensity(
    day, api, config, client, keys, tmp_warehouse, data_dir
):
    start, end = pd.Timestamp(day, tz="UTC"), pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=1)
    files = _read(data_dir / "grid" / "ensembleci" / "DE_direct_emissions.csv")
    mix_file = _between(files, start, end)
    truth = _between(_read(data_dir / "grid" / "dacf" / "DE_carbon_from_src_prod_forecasts_direct.csv"), start, end)
    assert len(mix_file) == 24 and len(truth) == 24
    hourly_mw = mix_file[list(FILE_PSR)] / 4  # DE columns are 4 x the hourly mean MW

    def entsoe(request):
        """The document ENTSO-E would send for the requested period, from the file's mix of those hours."""
        begin = pd.Timestamp(request.param("periodStart"), tz="UTC")
        mw = _between(files, begin, pd.Timestamp(request.param("periodEnd"), tz="UTC"))[list(FILE_PSR)] / 4
        series = [Series(psr, begin, _quarters(mw[fuel].to_numpy())) for fuel, psr in FILE_PSR.items()]
        document = gl_market_document(DE_EIC, begin, begin + pd.Timedelta(hours=len(mw)), series)
        return 200, document, {"Content-Type": "application/xml"}

    api.route(ENTSOE_PATH, entsoe)

    report = ingest_live(["DE"], start, end, config=config, client=client, extras=False, forecasts=False)
    assert {r.table: r.rows for r in report.results if r.batch_id.startswith("entsoe:")} == {
        "raw.grid_carbon_intensity": 24,
        "raw.grid_generation": 24 * len(FILE_PSR),
    }
    [call] = api.calls(ENTSOE_PATH)
    # the day, and the 24 h before it that show which production types report
    assert (call.param("periodStart"), call.param("periodEnd")) == (
        f"{start - pd.Timedelta(days=1):%Y%m%d}0000",
        f"{end:%Y%m%d}0000",
    )

    with reader(tmp_warehouse) as con:
        live = con.execute(
            """SELECT hour_utc, carbon_intensity_gco2_per_kwh, signal_type, basis, scope, quality_flag
               FROM raw.grid_carbon_intensity WHERE region = 'DE' AND data_source = 'entsoe' ORDER BY hour_utc"""
        ).df()
        generation = con.execute(
            "SELECT hour_utc, fuel, generation_mw FROM raw.grid_generation WHERE data_source = 'entsoe'"
        ).df()
    assert set(zip(live["signal_type"], live["basis"], live["scope"])) == {("average", "production", "direct")}
    assert set(live["quality_flag"]) == {"recomputed_from_mix"}
    live = live.set_index(pd.to_datetime(live["hour_utc"], utc=True))["carbon_intensity_gco2_per_kwh"]
    assert live.index.equals(truth.index)

    # MW as the hourly mean: the file's value / 4, within the whole-MW rounding of the quarter-hour points
    loaded = generation.pivot(index="hour_utc", columns="fuel", values="generation_mw")
    loaded.index = pd.to_datetime(loaded.index, utc=True)
    assert np.abs(loaded[list(FILE_PSR)].to_numpy() - hourly_mw.to_numpy()).max() <= 0.5

    error = (live - truth["carbon_intensity"]).abs() / truth["carbon_intensity"]
    print(f"\nENTSO-E live DE {start:%Y-%m-%d} vs DACF direct CI: max {error.max():.4%}, mean {error.mean():.4%}")
    assert error.max() < 0.02
    # the same as the file loader's recomputation of the file mix
    recomputed = intensity_from_mix(mix_file[list(FILE_PSR)], CARBONCAST_DIRECT)
    assert live.to_numpy() == pytest.approx(recomputed.to_numpy(), rel=0.02)
    # and not the "direct" file's carbon_intensity column, which is lifecycle
    assert ((live - mix_file["carbon_intensity"]).abs() / mix_file["carbon_intensity"]).mean() > 0.05
