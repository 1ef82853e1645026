"""Chart helpers shared by the reports: a headless pyplot, deterministic PNG files, one palette."""

from __future__ import annotations

from pathlib import Path

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666", "#1f78b4", "#b2df8a")


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib  # noqa: PLC0415 - plotting loads only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - plotting loads only when a chart is drawn

    return plt


def save_figure(fig, path: Path, tight: bool = True, dpi: int = 100) -> None:
    """Write `fig` as PNG without a timestamp in its metadata (same figure, same bytes) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight" if tight else None, metadata={"Software": None})
    pyplot().close(fig)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]
