"""HTML of the Carbon pages, rendered server-side from the documents of ui.data. Every value from the warehouse goes
through `esc` (a job named `<script>` shows as text) and every URL part through `quote`."""

from __future__ import annotations

import re
from html import escape
from urllib.parse import quote

import pandas as pd

from scheduling.explain.template import TemplateExplainer
from ui import svg

STYLE = (
    "body{font-family:sans-serif;margin:1.2em;color:#222}h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;"
    "white-space:nowrap}td.t{white-space:normal}"
    "th{background:#f3f3f3}td.t,th.t{text-align:left}nav a{margin-right:1em}.note{color:#666}"
    ".stale{background:#fff3cd;padding:.4em}.empty{background:#eef;padding:1em}.kpi{display:inline-block;"
    "margin:0 1.5em .5em 0}.kpi b{display:block;font-size:1.5em}pre{white-space:pre-wrap;background:#f7f7f7;"
    "padding:.6em}svg{max-width:100%;height:auto}"
)


_UTC_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d):\d\d(\.\d+)?(Z|\+00:00)$")


def esc(value) -> str:
    """A value as escaped text: n/a for missing, floats to 3 decimals, UTC times as YYYY-MM-DD HH:MM."""
    if value is None or (not isinstance(value, (list, dict, str)) and pd.isna(value)):
        return "n/a"
    if isinstance(value, float):
        return escape(f"{value:.3f}")
    if isinstance(value, str) and (time := _UTC_TIME.match(value)):
        return f"{time[1]} {time[2]}"
    return escape(str(value))


def job_href(base: str, planner_id: str) -> str:
    """The job page of a planner id `tenant/job_id`."""
    tenant, _, job_id = str(planner_id).partition("/")
    return f"{base}/jobs/{quote(tenant, safe='')}/{quote(job_id, safe='')}"


def page(title: str, base: str, body: str, doc: dict | None = None) -> str:
    stale = (doc or {}).get("stale")
    banner = (
        f'<p class="stale">A DAG is writing the warehouse: this is what was read at {esc(stale["read_at"])}.</p>'
        if stale
        else ""
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{STYLE}</style>"
        f'</head><body><nav><a href="{base}/">Overview</a><a href="{base}/plan">Current plan</a>'
        f'<a href="{base}/services">Services</a></nav>'
        f"<h1>{esc(title)}</h1>{banner}{body}</body></html>"
    )


def table(rows: list[dict], columns: list[str], text_columns: tuple = (), links: dict | None = None) -> str:
    """An HTML table of `columns` of `rows`; `links` maps a column to a function row -> href."""
    links = links or {}
    head = "".join(f'<th class="{"t" if c in text_columns else ""}">{esc(c)}</th>' for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            text = esc(row.get(c))
            if c in links:
                text = f'<a href="{escape(links[c](row))}">{text}</a>'
            cells.append(f'<td class="{"t" if c in text_columns else ""}">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def busy_page(base: str, message: str) -> str:
    return page(
        "Carbon",
        base,
        f'<p class="stale">{esc(message)}</p>',
    ).replace("<head>", '<head><meta http-equiv="refresh" content="5">', 1)


# ------------------------------------------------------------------------------------------------ overview


def overview_page(doc: dict, base: str) -> str:
    if doc.get("window") is None:
        body = (
            '<p class="empty">No job has ended yet: the ledger fills as the hourly loop (<code>plan_hourly</code>) '
            "runs and the <code>ledger</code> DAG rebuilds the marts. Submit jobs with <code>submit_jobs</code> "
            "and see the <a href='plan'>current plan</a>.</p>"
        )
        return page("Carbon: overview", base, body, doc)
    w, t = doc["window"], doc["totals"]
    kpis = [
        ("realized kgCO2e", t["realized_kgco2e"]),
        ("run-now kgCO2e", t["counterfactual_kgco2e"]),
        ("saving %", t["saving_pct"]),
        ("deadlines met %", t["deadlines_met_pct"]),
        ("deadline regret %", t.get("deadline_regret_pct")),
        ("jobs", t["jobs"]),
        ("finished", t["finished"]),
        ("failed", t["failed"]),
    ]
    days = doc["days"]
    labels = [str(d["day"])[:10] for d in days]
    parts = [
        f"<p>Jobs submitted {esc(str(w['start'])[:10])} to {esc(str(w['end'])[:10])} (exclusive), the last "
        f"{esc(w['days'])} days of the ledger. Same figures: <code>{esc(doc['ledger_command'])}</code></p>",
        '<div id="totals">'
        + "".join(f'<span class="kpi" data-key="{esc(k)}"><b>{esc(v)}</b>{esc(k)}</span>' for k, v in kpis)
        + "</div>",
        "<h2>Realized against run-now, per day of submission</h2>",
        svg.grouped_bars(
            labels,
            [
                ("run now", [d["counterfactual_kgco2e"] for d in days]),
                ("realized", [d["realized_kgco2e"] for d in days]),
            ],
            "kgCO2e",
            "Realized against run-now per day",
        ),
        table(
            days,
            ["day", "jobs", "finished", "failed", "realized_kgco2e", "counterfactual_kgco2e", "saving_pct"]
            + ["deadlines_met_pct", "deadline_regret_pct"],
            ("day",),
        ).replace("<table>", '<table id="per-day">', 1),
        "<h2>GPU utilization per cluster</h2>",
        "<p class='note'>GPU-hours of the dispatched attempts while the loop ran in the window, against the "
        "cluster's GPUs over the same hours.</p>",
        svg.hbars(
            [c["cluster"] for c in doc["clusters"]],
            [c["utilization_pct"] for c in doc["clusters"]],
            "%",
            "GPU utilization",
        ),
        table(doc["clusters"], ["cluster", "region", "attempts", "gpus", "gpu_hours", "utilization_pct"], ("cluster",)),
        "<h2>Forecast used against actual intensity, per region</h2>",
        "<p class='note'>The planned windows of the started attempts, valued at the forecast the plan used and at "
        "the actual intensity; the error is the forecast's alone.</p>",
        svg.grouped_bars(
            [r["region"] for r in doc["regions"]],
            [
                ("forecast", [r["forecast_kgco2e"] for r in doc["regions"]]),
                ("actual", [r["actual_kgco2e"] for r in doc["regions"]]),
            ],
            "kgCO2e",
            "Planned windows: forecast against actual",
        ),
        table(
            doc["regions"],
            ["region", "attempts", "forecast_kgco2e", "actual_kgco2e", "forecast_error_pct"]
            + ["mean_actual_gco2_per_kwh", "realized_kgco2e"],
            ("region",),
        ),
    ]
    return page("Carbon: overview", base, "".join(parts), doc)


# ------------------------------------------------------------------------------------------------ plan


def plan_page(doc: dict, base: str, note: str = "") -> str:
    lead = f"<p class='note'>{esc(note)}</p>" if note else ""
    if doc.get("plan") is None:
        missing = f" Plan {esc(doc['missing'])} is not in plan.plans." if doc.get("missing") else ""
        body = (
            f'{lead}<p class="empty">No plan yet.{missing} The hourly loop (<code>plan_hourly</code>) writes one '
            "every hour once jobs are queued.</p>"
        )
        return page("Carbon: current plan", base, body, doc)
    plan = doc["plan"]
    rows = [{"label": f"{c['cluster']} ({c.get('zone') or '?'})", "zone": c.get("zone")} for c in doc["clusters"]]
    index = {c["cluster"]: i for i, c in enumerate(doc["clusters"])}
    bars = [
        {
            "row": index[a["cluster"]],
            "start": a["start_time"],
            "end": a["end_time"],
            "late": a.get("late"),
            "label": f"{a['job_id']}: {a['start_time']} to {a['end_time']}, {float(a['expected_kgco2e']):.3f} kgCO2e",
            "href": job_href(base, a["job_id"]),
        }
        for a in doc["assignments"]
    ]
    bands = {zone: v["hours"] for zone, v in doc["intensity"].items()}
    sources = sorted({f"{zone}: {v['source']}" for zone, v in doc["intensity"].items()})
    job_link = {"job_id": lambda r: job_href(base, r["job_id"])}
    queued_link = {"job_id": lambda r: job_href(base, f"{r['tenant']}/{r['job_id']}")}
    parts = [
        lead,
        table([plan], ["plan_id", "plan_time", "policy", "n_jobs", "n_assigned", "expected_kgco2e"], ("plan_id",)),
        f"<p class='note'>Forecast: {esc(plan.get('forecast_version'))}</p>",
        svg.timeline(
            doc["span"]["start"],
            doc["span"]["end"],
            rows,
            bars,
            bands,
            f"Plan {plan['plan_id']}: jobs per cluster, forecast intensity behind",
        ),
        f"<p class='note'>Intensity behind each cluster: {esc('; '.join(sources))}.</p>",
        f"<h2>Jobs that wait ({len(doc['waiting'])})</h2>",
        table(doc["waiting"], ["job_id", "starts", "why"], ("job_id", "why"), job_link).replace(
            "<table>", '<table id="waiting">', 1
        ),
        f"<h2>Assignments ({len(doc['assignments'])})</h2>",
        table(
            doc["assignments"],
            ["job_id", "cluster", "node", "start_time", "end_time", "deadline", "expected_kgco2e", "status"],
            ("job_id", "cluster", "node", "status"),
            job_link,
        ),
        f"<h2>Queue: jobs waiting for a plan or a dispatch ({len(doc['queued'])})</h2>",
        table(
            doc["queued"],
            ["tenant", "job_id", "state", "submitted_at", "deadline", "est_duration_h", "why"],
            ("tenant", "job_id", "state", "why"),
            queued_link,
        ),
    ]
    return page("Carbon: current plan", base, "".join(parts), doc)


# ------------------------------------------------------------------------------------------------ job


def narrated(record: dict, text: str | None) -> bool:
    """True when the card text is not the template's: the explainer LLM (PLAN_EXPLAINER=chat) wrote it."""
    return bool(text) and text != TemplateExplainer().explain(record)


def _short_time(value) -> str:
    """MM-DD HH:MM of an ISO time (the year and zone are the page's)."""
    return str(value)[5:16].replace("T", " ")


def decision_card(decision: dict) -> str:
    r, text = decision.get("record") or {}, decision.get("text")
    chosen, cf = r.get("chosen") or {}, r.get("counterfactuals") or {}
    alternatives = r.get("alternatives") or []
    labels = [f"chosen: {chosen.get('region')} {_short_time(chosen.get('start_time'))}"]
    values = [chosen.get("kgco2e")]
    labels += [f"{a.get('region')} {_short_time(a.get('start_time'))}" for a in alternatives]
    values += [a.get("kgco2e") for a in alternatives]
    labels += ["run now", "greedy", "optimum"]
    values += [cf.get("run_now_kgco2e"), cf.get("greedy_carbon_kgco2e"), cf.get("optimum_kgco2e")]
    weights = r.get("weights") or {}
    models = r.get("models") or {}
    parts = [
        f"<h3>Plan {esc(decision.get('plan_id'))}</h3>",
        table(
            [{k: r.get(k) for k in ("priority", "urgency", "flexibility", "opportunity")}],
            ["priority", "urgency", "flexibility", "opportunity"],
        ),
        f"<p class='note'>Weights: {esc(', '.join(f'{k} {v}' for k, v in sorted(weights.items())))}</p>",
        svg.hbars(labels, values, "kgCO2e", "Carbon of the choice, the alternatives and the counterfactuals", 0),
        table(
            [{"": "chosen", **chosen}] + [{"": f"alternative {i + 1}", **a} for i, a in enumerate(alternatives)],
            ["", "region", "cluster", "start_time", "kgco2e"],
            ("", "region", "cluster", "start_time"),
        ),
        table([cf], ["run_now_kgco2e", "greedy_carbon_kgco2e", "optimum_kgco2e"]),
        f"<p>Binding constraints: {esc(', '.join(r.get('binding_constraints') or []) or 'none')}</p>",
        f"<p>Forecast: {esc(r.get('forecast_version'))}</p>",
        "<p>Models: "
        + esc(
            "; ".join(f"{k} {v.get('name')} {v.get('version') or v.get('source')}" for k, v in sorted(models.items()))
            or "n/a"
        )
        + "</p>",
    ]
    if narrated(r, text):
        parts.append(f'<h4>Narration (explainer LLM)</h4><pre class="narration">{esc(text)}</pre>')
    elif text:
        parts.append(f"<details><summary>Card text</summary><pre>{esc(text)}</pre></details>")
    return f'<div class="decision">{"".join(parts)}</div>'


def power_timeline(runs: list[dict], changes: list[dict]) -> str:
    """The job's GPU power limits over time: each attempt's start limit, then every change the hourly plans made
    while it ran, with its explanation card (its counterfactual: the limit kept)."""
    rows = [
        {"at": r.get("started_at"), "attempt": r.get("attempt"), "power_limit_w": r.get("power_limit_w"),
         "by": f"dispatch ({r.get('plan_id')})"}
        for r in runs if r.get("started_at") is not None and not pd.isna(r.get("started_at"))
    ]  # fmt: skip
    rows += [
        {"at": c["changed_at"], "attempt": c.get("attempt"), "power_limit_w": c["to_limit_w"],
         "by": f"{c['reason']} ({c['plan_id']}, {c['status']})"}
        for c in changes
    ]  # fmt: skip
    rows.sort(key=lambda r: str(r["at"]))
    if not rows:
        return "<h2>Power limits</h2><p class='note'>Not started yet.</p>"
    cards = "".join(f'<div class="card power-change"><p>{esc(c["text"])}</p></div>' for c in changes)
    return (
        "<h2>Power limits</h2>"
        + table(rows, ["at", "attempt", "power_limit_w", "by"], ("by",)).replace("<table>", '<table id="power">', 1)
        + cards
    )


def preemption_list(preemptions: list[dict]) -> str:
    """The job's preemptions at a checkpoint, each with its explanation card (its counterfactual: keep running);
    its attempts, the partial runs among them, are in "Planned against actual"."""
    if not preemptions:
        return ""
    rows = [
        {"at": p["preempt_at"], "attempt": p.get("attempt"), "cluster": p.get("cluster"), "reason": p["reason"],
         "work_done": p["work_done"], "resume_at": p.get("resume_at"), "status": p["status"]}
        for p in preemptions
    ]  # fmt: skip
    cards = "".join(f'<div class="card preemption"><p>{esc(p["text"])}</p></div>' for p in preemptions)
    columns = ["at", "attempt", "cluster", "reason", "work_done", "resume_at", "status"]
    return (
        f"<h2>Preemptions ({len(rows)})</h2>"
        + table(rows, columns, ("cluster", "reason", "status")).replace("<table>", '<table id="preemptions">', 1)
        + cards
    )


def job_page(doc: dict, base: str) -> str:
    title = f"Job {doc['job']}"
    if not doc.get("found"):
        return page(title, base, f'<p class="empty">No job {esc(doc["job"])} in the queue.</p>', doc)
    spec, system, ledger = doc["spec"], doc["system"], doc.get("ledger")
    decisions = list(reversed(doc.get("explanations") or []))  # newest plan first
    parts = [
        table(
            [{**spec, **system}],
            ["state", "attempts", "submitted_at", "deadline", "est_duration_h", "gpus", "job_type", "home_region"],
            ("state", "job_type", "home_region"),
        ).replace("<table>", '<table id="job">', 1),
        "<h2>Realized carbon</h2>",
        table(
            [ledger],
            ["outcome", "cluster", "realized_kgco2e", "counterfactual_kgco2e", "saving_pct", "deadline_met"],
            ("outcome", "cluster"),
        ).replace("<table>", '<table id="ledger">', 1)
        if ledger
        else "<p class='note'>Not in the ledger yet (the job has not ended, or the ledger was not rebuilt).</p>",
        "<h2>State history</h2>",
        table(
            doc["history"],
            ["seq", "changed_at", "event", "from_state", "to_state", "reason", "source"],
            ("event", "from_state", "to_state", "reason", "source"),
        ).replace("<table>", '<table id="history">', 1),
        "<h2>Planned against actual</h2>",
        table(
            doc.get("runs") or [],
            ["attempt", "cluster", "planned_start", "started_at", "planned_end", "ended_at", "runtime_error_pct"]
            + ["energy_kwh", "expected_kgco2e", "realized_kgco2e", "outcome"],
            ("cluster", "outcome"),
        ),
        power_timeline(doc.get("runs") or [], doc.get("power_changes") or []),
        preemption_list(doc.get("preemptions") or []),
        f"<h2>Decisions ({len(decisions)})</h2>",
    ]
    if decisions:
        parts.append(decision_card(decisions[0]))
        if len(decisions) > 1:
            older = "".join(decision_card(d) for d in decisions[1:])
            parts.append(f"<details><summary>Earlier decisions ({len(decisions) - 1})</summary>{older}</details>")
    else:
        parts.append("<p class='note'>No plan has decided on this job yet.</p>")
    return page(title, base, "".join(parts), doc)


# ------------------------------------------------------------------------------------------------ services


def service_href(base: str, service: str) -> str:
    tenant, _, service_id = str(service).partition("/")
    return f"{base}/services/{quote(tenant, safe='')}/{quote(service_id, safe='')}"


SERVICE_COLUMNS = ["service", "service_hours", "tokens", "kgco2e", "g_per_1k_tokens", "static_g_per_1k_tokens",
                   "reduction_pct", "slo_attainment_pct", "mean_gpus", "static_gpus"]  # fmt: skip


def services_page(doc: dict, base: str) -> str:
    if doc.get("window") is None:
        body = (
            '<p class="empty">No service has served an hour yet: submit services with <code>python -m scheduling '
            "services submit FILE</code>; each loop hour plans their replicas and the ledger fills as they serve.</p>"
        )
        return page("Carbon: services", base, body, doc)
    w = doc["window"]
    body = (
        f"<p>The last {esc(w['days'])} days of the services' ledger, to {esc(w['end'])}, against static "
        "provisioning for the peak in the home region.</p>"
        + table(doc["services"], SERVICE_COLUMNS, ("service",), {"service": lambda r: service_href(base, r["service"])})
    )
    return page("Carbon: services", base, body, doc)


def service_page(doc: dict, base: str) -> str:
    title = f"Service {doc['service']}"
    if doc.get("totals") is None and not doc.get("provisions"):
        return page(title, base, '<p class="empty">This service has not been planned or served yet.</p>', doc)
    parts = []
    t = doc.get("totals")
    if t is not None:
        kpis = [("gCO2e per 1k tokens", t["g_per_1k_tokens"]), ("static", t["static_g_per_1k_tokens"]),
                ("reduction %", t["reduction_pct"]), ("latency target met %", t["slo_attainment_pct"]),
                ("service-hours", t["service_hours"]), ("mean GPUs", t["mean_gpus"])]  # fmt: skip
        parts.append(
            '<div id="totals">'
            + "".join(f'<span class="kpi" data-key="{esc(k)}"><b>{esc(v)}</b>{esc(k)}</span>' for k, v in kpis)
            + "</div>"
        )
    hours = doc.get("hours") or []
    if hours:
        times = [h["hour_utc"] for h in hours]
        parts += [
            "<h2>Load</h2>",
            svg.lines(times, [("demand", [h["demand_tokens_per_s"] for h in hours])], "tokens/s", "Demand"),
            "<h2>GPUs</h2>",
            svg.lines(
                times,
                [("planned", [h["gpus"] for h in hours]), ("static", [h["static_gpus"] for h in hours])],
                "GPUs",
                "GPUs held",
            ),  # fmt: skip
            "<h2>Carbon per 1k tokens</h2>",
            svg.lines(
                times,
                [
                    ("planned", [h["g_per_1k_tokens"] for h in hours]),
                    ("static", [h["static_g_per_1k_tokens"] for h in hours]),
                ],
                "gCO2e / 1k tokens",
                "Carbon per 1k output tokens",
            ),  # fmt: skip
            table(hours, list(hours[0]), ("hour_utc", "clusters")).replace("<table>", '<table id="hours">', 1),
        ]
    if doc.get("provisions"):
        parts += [
            "<h2>The latest plans</h2>",
            table(doc["provisions"], list(doc["provisions"][0]), ("plan_time", "cluster", "explanation")),
        ]
    return page(title, base, "".join(parts), doc)
