"""Forecast-against-actual plots with the P10–P90 band (PNG, matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

UNITS = {"carbon_intensity": "gCO2/kWh (direct, production-based)", "solar": "MW", "wind": "MW"}


def _mpl():
    import matplotlib  # noqa: PLC0415 - plotting loads only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - plotting loads only when a chart is drawn

    return plt


def plot_forecast(
    scored: pd.DataFrame,
    path: str | Path,
    title: str,
    target: str = "carbon_intensity",
    baseline: pd.Series | None = None,
    baseline_label: str = "published day-ahead",
    zoom_days: int = 14,
    max_horizon: int = 24,
) -> Path:
    """Day-ahead forecast (horizons 1…`max_horizon` of each daily issue, so one value per hour) against the actual:
    the whole window on top, the first `zoom_days` below. `baseline` (indexed by hour) is drawn dashed."""
    plt = _mpl()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    da = scored[(scored["horizon_h"] >= 1) & (scored["horizon_h"] <= max_horizon)].sort_values("target_time")
    da = da.drop_duplicates("target_time", keep="last")
    fig, axes = plt.subplots(2, 1, figsize=(13, 7.5), constrained_layout=True)
    if da.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no forecasts", ha="center", va="center", transform=ax.transAxes)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    t = pd.to_datetime(da["target_time"]).dt.tz_convert("UTC").dt.tz_localize(None)
    zoom_end = t.iloc[0] + pd.Timedelta(days=zoom_days)
    for ax, sel, lw in ((axes[0], np.ones(len(t), dtype=bool), 0.5), (axes[1], (t < zoom_end).to_numpy(), 1.2)):
        ax.fill_between(
            t[sel],
            da["p10"][sel],
            da["p90"][sel],
            color="tab:blue",
            alpha=0.25,
            linewidth=0,
            label="P10–P90",
            step="mid",
        )
        ax.plot(t[sel], da["actual"][sel], color="black", lw=lw, label="actual")
        ax.plot(t[sel], da["p50"][sel], color="tab:blue", lw=lw, label="forecast P50")
        if baseline is not None and len(baseline):
            b = baseline.copy()
            b.index = pd.to_datetime(b.index).tz_convert("UTC").tz_localize(None)
            b = b[(b.index >= t[sel].min()) & (b.index <= t[sel].max())]
            ax.plot(b.index, b.values, color="tab:orange", lw=lw * 0.9, ls="--", label=baseline_label)
        ax.set_ylabel(UNITS.get(target, ""))
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[1].set_title(f"first {zoom_days} days")
    axes[0].legend(loc="upper right", ncol=4, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plot(res, published, plot_dir: Path) -> Path:
    """The day-ahead plot of one backtest result (a `BacktestResult`) against the published forecast, as
    `<plot_dir>/<target>_<model>_<region>.png`."""
    baseline = None
    label = "published"
    if published is not None and len(published):
        pub_target = "carbon_intensity_direct" if res.target == "carbon_intensity" else f"{res.target}_mw"
        part = published[(published["region"] == res.region) & (published["target"] == pub_target)]
        if len(part):
            baseline = part.set_index("hour_utc")["value"]
            label = f"published day-ahead ({part['publisher'].iloc[0]})"
    path = plot_dir / f"{res.target}_{res.model}_{res.region}.png"
    metric = res.metrics.get("day_ahead_mape", res.metrics.get("day_ahead_error_pct_of_mean"))
    title = (
        f"{res.region} {res.target}: {res.model} day-ahead (issued 00:00 UTC, h 1–24), "
        f"error {metric} %, P10–P90 coverage {res.metrics.get('day_ahead_coverage_p10_p90')} %"
    )
    return plot_forecast(res.forecasts, path, title, target=res.target, baseline=baseline, baseline_label=label)
