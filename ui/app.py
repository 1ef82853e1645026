"""The Carbon pages as a FastAPI app: HTML pages and their JSON twins under /api, every route behind the caller's
authentication dependency (the Airflow plugin passes Airflow's: a session cookie or a bearer token).

Routes (relative to where the app is mounted, /carbon in Airflow):
  /                           overview            /api/overview
  /plan[?plan_id=|dag_id=&run_id=]  current plan  /api/plan[...]
  /jobs/{tenant}/{job_id}     job page            /api/jobs/{tenant}/{job_id}
  /services                   services            /api/services
  /services/{tenant}/{id}     one service         /api/services/{tenant}/{id}
  /metrics                    Prometheus metrics (`ui.metrics`)

Without a valid session a page redirects to the log-in page (`login_url(next)`) and the API answers 401.
/metrics is outside Airflow's log-in (a scraper holds no Airflow session; the metrics name no job): open, or, where
`CARBON_METRICS_TOKEN` is set, for a request bearing `Authorization: Bearer <that token>` only.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ui import data, metrics, pages

METRICS_TOKEN_ENV = "CARBON_METRICS_TOKEN"


def create_app(
    authenticate: Callable,
    login_url: Callable[[str], str] | None = None,
    plan_of_run: Callable[[str, str], str | None] | None = None,
    db_path=None,
    metrics_cache: metrics.MetricsCache | None = None,
) -> FastAPI:
    """The app. `authenticate`: a FastAPI dependency that raises HTTPException(401/403) without a valid user;
    `login_url(next_url)`: where a browser without a session is sent; `plan_of_run(dag_id, run_id)`: the plan id a
    DAG run wrote (or None); `db_path`: the warehouse (default WAREHOUSE_PATH); `metrics_cache`: the /metrics snapshot
    (default: one of `db_path` with its default age)."""
    app = FastAPI(title="Carbon", docs_url=None, redoc_url=None)
    router = APIRouter(dependencies=[Depends(authenticate)])
    scrape = metrics_cache if metrics_cache is not None else metrics.MetricsCache(db_path)

    @app.exception_handler(HTTPException)
    async def _unauthenticated(request: Request, exc: HTTPException) -> Response:
        path, root = request.url.path, base(request)
        is_api = (path[len(root) :] if path.startswith(root) else path).startswith("/api")
        if exc.status_code in (401, 403) and not is_api and login_url is not None and request.method == "GET":
            return RedirectResponse(login_url(str(request.url)), status_code=302)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    def base(request: Request) -> str:
        return request.scope.get("root_path", "").rstrip("/")

    def read(request: Request, what, *args, render=None, extra: dict | None = None) -> Response:
        """`what`'s document as JSON (with `extra`), or as the HTML of `render(doc, base)`; 503 while busy."""
        try:
            doc = data.read(what, *args, db_path=db_path)
        except data.WarehouseBusy as exc:
            if render is None:
                return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})
            return HTMLResponse(pages.busy_page(base(request), str(exc)), status_code=503, headers={"Retry-After": "5"})
        if render is None:
            return JSONResponse({**doc, **(extra or {})})
        return HTMLResponse(render(doc, base(request)))

    def plan_id_of(plan_id: str | None, dag_id: str | None, run_id: str | None) -> tuple[str | None, str]:
        """The plan asked for, and a note when a DAG run was named: the run's own plan, or why the latest."""
        if plan_id or not (dag_id and run_id):
            return plan_id, ""
        found = plan_of_run(dag_id, run_id) if plan_of_run is not None else None
        if found:
            return found, f"The plan written by {dag_id} run {run_id}."
        return None, f"{dag_id} run {run_id} has stored no plan (not run yet, a dry run, or failed): the latest plan."

    @router.get("/", response_class=HTMLResponse)
    def overview_page(request: Request) -> Response:
        return read(request, data.overview, render=pages.overview_page)

    @router.get("/api/overview")
    def overview_json(request: Request) -> Response:
        return read(request, data.overview)

    @router.get("/plan", response_class=HTMLResponse)
    def plan_page(
        request: Request, plan_id: str | None = None, dag_id: str | None = None, run_id: str | None = None
    ) -> Response:
        chosen, note = plan_id_of(plan_id, dag_id, run_id)
        return read(request, data.current_plan, chosen, render=lambda doc, b: pages.plan_page(doc, b, note))

    @router.get("/api/plan")
    def plan_json(
        request: Request, plan_id: str | None = None, dag_id: str | None = None, run_id: str | None = None
    ) -> Response:
        chosen, note = plan_id_of(plan_id, dag_id, run_id)
        return read(request, data.current_plan, chosen, extra={"note": note} if note else None)

    @router.get("/jobs/{tenant}/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, tenant: str, job_id: str) -> Response:
        return read(request, data.job_page, tenant, job_id, render=pages.job_page)

    @router.get("/api/jobs/{tenant}/{job_id}")
    def job_json(request: Request, tenant: str, job_id: str) -> Response:
        return read(request, data.job_page, tenant, job_id)

    @router.get("/services", response_class=HTMLResponse)
    def services_page(request: Request) -> Response:
        return read(request, data.services, render=pages.services_page)

    @router.get("/api/services")
    def services_json(request: Request) -> Response:
        return read(request, data.services)

    @router.get("/services/{tenant}/{service_id}", response_class=HTMLResponse)
    def service_page(request: Request, tenant: str, service_id: str) -> Response:
        return read(request, data.service_page, tenant, service_id, render=pages.service_page)

    @router.get("/api/services/{tenant}/{service_id}")
    def service_json(request: Request, tenant: str, service_id: str) -> Response:
        return read(request, data.service_page, tenant, service_id)

    @app.get("/metrics")
    def metrics_text(request: Request) -> Response:
        token = os.environ.get(METRICS_TOKEN_ENV, "")
        given = request.headers.get("authorization", "")
        if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"detail": "a bearer token is required"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return Response(scrape.text(), media_type=metrics.CONTENT_TYPE)

    app.include_router(router)
    return app
