"""Error of the serving model (`scheduling.models.serving`), leave one configuration out: each measured batch cap
of a curve is predicted by the model fitted without it (the same curve's other caps). A cap at either end of its
curve is outside what the rest covers and is refused, as the model refuses any configuration the data lacks: those
are counted, not scored.

Error = |predicted / measured - 1| per quantity; the targets (< 10 % on energy per token and on latency) are checked
as the mean over the language tasks a service runs (`LANGUAGE_TASKS`) and reported per task beside them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scheduling.models.serving import KEY, QUANTITIES, ServingKey, ServingModel, UnknownServingConfiguration

LANGUAGE_TASKS = ("chat", "code", "lm-arena-chat", "gpqa")  # text in, text out; the others are image/video/FIM
TARGET = 0.10


def leave_one_configuration_out(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per held-out configuration of `runs` (`load_serving_runs`): KEY, batch_cap, `refused` (outside the
    rest of its curve), and per quantity the measured value, the prediction and the error (NaN where refused)."""
    rows = []
    for key, curve in runs.groupby(list(KEY), sort=True):
        curve = curve.reset_index(drop=True)
        for i in range(len(curve)):
            row = {**dict(zip(KEY, key)), "batch_cap": int(curve["batch_cap"].iat[i])}
            model = ServingModel().fit(curve.drop(index=i))
            try:
                point = model.predict(ServingKey(*key), row["batch_cap"])
            except UnknownServingConfiguration:
                point = None
            row["refused"] = point is None
            for q in QUANTITIES:
                measured = float(curve[q].iat[i])
                predicted = np.nan if point is None else float(getattr(point, q))
                row[q] = measured
                row[f"{q}_predicted"] = predicted
                row[f"{q}_error"] = abs(predicted / measured - 1.0)
            rows.append(row)
    return pd.DataFrame(rows)


def summary(errors: pd.DataFrame) -> dict:
    """Mean / median / p90 error per quantity, over the language tasks and per (source, task), the counts scored and
    refused, and the targets."""

    def stats(frame: pd.DataFrame) -> dict:
        scored = frame[~frame["refused"]]
        out = {"configurations": int(len(frame)), "scored": int(len(scored)), "refused": int(frame["refused"].sum())}
        for q in QUANTITIES:
            e = scored[f"{q}_error"].to_numpy(float)
            out[q] = {
                "mean": float(e.mean()) if len(e) else None,
                "median": float(np.median(e)) if len(e) else None,
                "p90": float(np.quantile(e, 0.9)) if len(e) else None,
            }
        return out

    language = stats(errors[errors["task"].isin(LANGUAGE_TASKS)])
    return {
        "language_tasks": list(LANGUAGE_TASKS),
        "language": language,
        "all": stats(errors),
        "by_task": {f"{s} {t}": stats(g) for (s, t), g in errors.groupby(["source", "task"], sort=True)},
        "targets": {
            "energy_per_token_lt_10pct": language["joules_per_token"]["mean"] < TARGET,
            "latency_lt_10pct": language["latency_ms"]["mean"] < TARGET,
        },
    }


def summary_markdown(result: dict) -> str:
    """The summary as a Markdown table (mean error %, by source and task)."""

    def pct(v) -> str:
        return "–" if v is None else f"{100 * v:.1f} %"

    lines = [
        "| source, task | scored / refused | energy per token | latency | tokens/s |",
        "|---|---|---|---|---|",
    ]
    for name, s in [("language tasks", result["language"]), *result["by_task"].items(), ("all", result["all"])]:
        lines.append(
            f"| {name} | {s['scored']} / {s['refused']} | {pct(s['joules_per_token']['mean'])} | "
            f"{pct(s['latency_ms']['mean'])} | {pct(s['tokens_per_s']['mean'])} |"
        )
    t = {k: "met" if v else "missed" for k, v in result["targets"].items()}
    lines.append("")
    lines.append(
        f"Targets (mean over the language tasks, < 10 %): energy per token {t['energy_per_token_lt_10pct']}, "
        f"latency {t['latency_lt_10pct']}."
    )
    return "\n".join(lines)
