"""The Carbon pages in the Airflow UI: the app of `ui.app` mounted at /carbon on the API server, a "Carbon" entry in
the navigation and a "Carbon plan" tab on every plan_hourly run. Only Airflow's side lives here: its authentication
(a session cookie or a bearer token), its log-in page and the plan a DAG run wrote (its `plan` task's XCom).

Every Airflow process loads the plugins folder, task processes too, which never serve a page: the app (FastAPI, the
warehouse readers) is built on the first request, so loading this file imports nothing more."""

# No `from __future__ import annotations`: FastAPI resolves the `Request` annotation of a dependency at run time.
from functools import cache

from airflow.plugins_manager import AirflowPlugin


def _login_url(next_url: str) -> str:
    from airflow.api_fastapi.app import get_auth_manager  # noqa: PLC0415 - API server only

    return get_auth_manager().get_url_login(next_url=next_url)


def _plan_of_run(dag_id: str, run_id: str) -> str | None:
    """The plan id that the run's `plan` task returned, or None."""
    from airflow.models.xcom import XComModel  # noqa: PLC0415 - API server only
    from airflow.utils.session import create_session  # noqa: PLC0415 - API server only
    from sqlalchemy import select  # noqa: PLC0415 - API server only

    with create_session() as session:
        row = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == "plan",
                XComModel.key == "return_value",
            )
        ).first()
    summary = XComModel.deserialize_value(row) if row is not None else None
    return summary.get("plan_id") if isinstance(summary, dict) else None


@cache
def _app():
    from airflow.api_fastapi.core_api.security import get_user  # noqa: PLC0415 - API server only
    from fastapi import Request  # noqa: PLC0415 - API server only
    from fastapi.security import HTTPBearer  # noqa: PLC0415 - API server only

    from ui.app import create_app  # noqa: PLC0415 - API server only

    bearer = HTTPBearer(auto_error=False)

    async def authenticated(request: Request) -> None:
        """Airflow's own check (`get_user`): a bearer token, else the UI's session cookie; 401/403 without one."""
        await get_user(request, None, await bearer(request))

    return create_app(authenticated, login_url=_login_url, plan_of_run=_plan_of_run)


async def carbon_app(scope, receive, send) -> None:
    """ASGI entry point: the Carbon app, built on the first request."""
    await _app()(scope, receive, send)


class CarbonPlugin(AirflowPlugin):
    name = "carbon"
    fastapi_apps = [{"app": carbon_app, "url_prefix": "/carbon", "name": "Carbon"}]
    external_views = [
        {"name": "Carbon", "href": "/carbon/", "destination": "nav", "url_route": "carbon"},
        {
            "name": "Carbon plan",
            "href": "/carbon/plan?dag_id={DAG_ID}&run_id={RUN_ID}",
            "destination": "dag_run",
            "url_route": "carbon-plan",
        },
    ]
