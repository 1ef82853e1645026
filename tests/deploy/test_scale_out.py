"""The scale-out path (deploy/scale-out/, docs/scale-out.md): the configuration loads in that mode, the DAGs parse in
it, the warehouse target is parsed from the environment exactly, and the metadata database and the DuckLake catalog
really work on a throwaway PostgreSQL.

Set-up installs what this needs: the drivers (psycopg2, asyncpg), the Celery provider and the DuckDB extension wheels
are in requirements.txt, PostgreSQL comes from Debian (deploy/install-services.sh, run by `make test`, and by the
`postgres` fixture itself when root). So in CI everything here runs:
- the env files, WarehouseTarget parsing/statements/redaction, the config layer and the DAG parse with the
  scale-out environment; the executor classes load;
- on a PostgreSQL cluster in a temporary folder: `airflow db migrate` + the `warehouse` pool + `airflow db check`,
  a DuckLake warehouse written by two processes at once through warehouse.db, `dbt debug` with
  deploy/scale-out/profiles.yml, and warehouse.db's writer/reader on DuckLake.
Elsewhere a missing piece skips with its reason (in CI, CI=true, it fails instead). Without the drivers `import
airflow` fails when sql_alchemy_conn is postgresql, so the config and DagBag probes then run Airflow as a library
(_AIRFLOW__AS_LIBRARY). Nothing here needs the network. The Celery workers running the pipeline on this stack:
tests/deploy/test_celery_stack.py (slow).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.pg import create_database, lake_on
from warehouse import catalog, db

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy" / "scale-out"
DAGS = REPO_ROOT / "dags"
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
ENV_FILES = ("airflow.env", "airflow-kubernetes.env", "warehouse.env", "warehouse-motherduck.env")
SECRET_NAMES = {
    "PGPASSWORD",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "DUCKLAKE_CATALOG_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MOTHERDUCK_TOKEN",
}
# Values of the image layout (/opt/..., /mnt/...) that the tests point at this checkout / a temporary folder instead.
SHARED_DIRS = ("DATA_DIR", "MODELS_DIR", "SCHEDULES_DIR", "VAR_DIR")
EXPECTED_DAGS = {"ingest_cluster", "ingest_energy", "ingest_grid", "transform"}

HAVE_PG_DRIVERS = all(importlib.util.find_spec(m) is not None for m in ("psycopg2", "asyncpg"))
NO_DRIVER_REASON = "psycopg2/asyncpg not installed (pip install -r requirements.txt)"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


HAVE_CELERY = _installed("apache-airflow-providers-celery") and _installed("celery")
HAVE_KUBERNETES = _installed("apache-airflow-providers-cncf-kubernetes")


# ------------------------------------------------------------------------------------------------------ helpers
def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines as docker --env-file / systemd read them: no quotes, no expansion, # comments."""
    out: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        assert "=" in text, f"{path.name}:{number}: not KEY=value: {line!r}"
        key, value = text.split("=", 1)
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path.name}:{number}: bad name {key!r}"
        assert not key.startswith("export"), f"{path.name}:{number}: no `export` in an env file"
        assert not (value[:1] in "'\"" and value[:1] and value.endswith(value[:1])), (
            f"{path.name}:{number}: quotes would be kept literally by --env-file"
        )
        assert "${" not in value, f"{path.name}:{number}: ${{...}} is not expanded in env files"
        assert key not in out, f"{path.name}:{number}: {key} set twice"
        out[key] = value
    return out


def scale_out_env(tmp_path: Path, files: tuple[str, ...], **overrides: str) -> dict[str, str]:
    """The process environment of an Airflow component in scale-out mode: this machine's environment without any
    Airflow/warehouse settings of its own, the env files in order, the image-layout paths pointed at this checkout."""
    drop = set(catalog.ENV_VARS) | {"PGPASSWORD"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DBT_", "_AIRFLOW")) and k not in drop}
    for name in files:
        env.update(read_env_file(DEPLOY / name))
    home = tmp_path / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    for name in SHARED_DIRS:
        if name in env:
            env[name] = str(tmp_path / "shared" / name.lower())
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), str(DAGS), os.environ.get("PYTHONPATH", "")) if p),
        DBT_PROFILES_DIR=str(DEPLOY),
        PATH=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    env.update(overrides)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_host(url: str, host_port: str) -> str:
    """`url` with its host:port replaced (user, database, driver stay as configured)."""
    replaced, count = re.subn(r"@[^/@]+/", f"@{host_port}/", url)
    assert count == 1, url
    return replaced


def run(args: list[str], env: dict[str, str], timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    if check:
        assert proc.returncode == 0, (
            f"{' '.join(args[:4])} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def last_json(text: str) -> dict:
    """The last line of `text` that is a JSON object (Airflow may log after a probe prints)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise AssertionError(f"no JSON line in:\n{text[-2000:]}")


def airflow_config_options() -> dict[str, set[str]]:
    """Airflow's known options per section: core's config.yml plus the installed providers' configs, read from the
    files (importing airflow would initialise it with this process's settings)."""
    spec = importlib.util.find_spec("airflow")
    root = Path(list(spec.submodule_search_locations)[0])
    config = yaml.safe_load((root / "config_templates" / "config.yml").read_text())
    known = {section: set(body.get("options", {})) for section, body in config.items()}
    for dist in ("apache-airflow-providers-celery", "apache-airflow-providers-cncf-kubernetes"):
        if not _installed(dist):
            continue
        files = [f for f in importlib.metadata.distribution(dist).files or [] if f.name == "get_provider_info.py"]
        info = runpy.run_path(str(files[0].locate()))["get_provider_info"]()
        for section, body in info.get("config", {}).items():
            known.setdefault(section, set()).update(body.get("options", {}))
    return known


# ------------------------------------------------------------------------------------------------- env files
def test_env_files_are_plain_and_hold_no_secrets():
    for name in ENV_FILES:
        values = read_env_file(DEPLOY / name)
        assert values, name
        leaked = SECRET_NAMES & set(values)
        assert not leaked, f"{name} sets secrets {leaked}: they belong in the secret store (secrets.env.example)"
        for key, value in values.items():
            assert not re.search(r"://[^/@:]+:[^/@]+@", value), f"{name}: {key} carries a password in its URL"
    example = read_env_file(DEPLOY / "secrets.env.example")
    assert set(example) == SECRET_NAMES and not any(example.values())


def test_airflow_settings_name_real_options():
    known = airflow_config_options()
    provider_sections = {"celery", "celery_broker_transport_options", "kubernetes_executor"}
    plugin_sections = {"cosmos"}  # astronomer-cosmos reads its own section
    for name in ("airflow.env", "airflow-kubernetes.env"):
        for key in read_env_file(DEPLOY / name):
            if not key.startswith("AIRFLOW__"):
                continue
            _, section, option = key.split("__", 2)
            section, option = section.lower(), option.lower()
            if section in plugin_sections or (section in provider_sections and section not in known):
                continue  # provider not installed here: checked where it is
            assert option in known.get(section, set()), f"{name}: {key} is not an Airflow option [{section}] {option}"


def test_celery_and_kubernetes_variants():
    celery = read_env_file(DEPLOY / "airflow.env")
    kube = {**celery, **read_env_file(DEPLOY / "airflow-kubernetes.env")}
    assert celery["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert kube["AIRFLOW__CORE__EXECUTOR"] == "KubernetesExecutor"
    for values in (celery, kube):
        assert values["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert celery["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
    assert celery["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
    pod = yaml.safe_load((DEPLOY / "pod_template.yaml").read_text())
    assert [c["name"] for c in pod["spec"]["containers"]] == ["base"]  # the KubernetesExecutor fills in `base`
    assert kube["AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE"].endswith("deploy/scale-out/pod_template.yaml")
    pools = json.loads((DEPLOY / "pools.json").read_text())
    assert pools["warehouse"]["slots"] >= 1


def test_requirements_are_pinned_and_new():
    """requirements.txt holds what `make test` exercises (drivers, extension wheels, Celery), the scale-out file only
    image extras; no package in both; the DuckDB extensions carry duckdb's version."""
    lines = [line.split("#")[0].strip() for line in (DEPLOY / "requirements-scale-out.txt").read_text().splitlines()]
    pins = dict(line.split("==", 1) for line in lines if line)
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.]*", v) for v in pins.values()), pins
    locked = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            locked[name.lower().replace("_", "-")] = version.strip()
    assert "apache-airflow-providers-cncf-kubernetes" in pins
    for needed in (
        "apache-airflow-providers-celery",
        "celery",
        "redis",
        "psycopg2-binary",
        "asyncpg",
        "duckdb-extension-ducklake",
        "duckdb-extension-postgres-scanner",
        "duckdb-extension-httpfs",
    ):
        assert needed in locked, f"{needed} belongs in requirements.txt: make test exercises it"
    both = {n for n in pins if n.lower().replace("_", "-") in locked}
    assert not both, f"already pinned in requirements.txt: {both}"
    extensions = {n: v for n, v in {**pins, **locked}.items() if n.startswith("duckdb-extension-")}
    assert set(extensions.values()) == {locked["duckdb"]}, "DuckDB extensions must match the duckdb version"


# ------------------------------------------------------------------------- (a) the configuration loads in that mode
_CONFIG_PROBE = r"""
import json, sys
from airflow.configuration import conf
wanted = json.loads(sys.argv[1])
out = {"values": {f"{s}.{k}": conf.get(s, k) for s, k in wanted}, "executor": None}
if sys.argv[2] == "1":
    from airflow.executors.executor_loader import ExecutorLoader
    out["executor"] = ExecutorLoader.import_default_executor_cls()[0].__name__
print(json.dumps(out))
"""

VARIANTS = {
    "celery": (("airflow.env", "warehouse.env"), "CeleryExecutor", HAVE_CELERY),
    "kubernetes": (("airflow.env", "airflow-kubernetes.env", "warehouse.env"), "KubernetesExecutor", HAVE_KUBERNETES),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_configuration_loads_in_scale_out_mode(tmp_path, variant):
    files, executor, have_provider = VARIANTS[variant]
    env = scale_out_env(tmp_path, files)
    if not HAVE_PG_DRIVERS:
        env["_AIRFLOW__AS_LIBRARY"] = "1"  # the configuration layer alone: the ORM would need the driver
    wanted = sorted({tuple(k.split("__", 2)[1:]) for k in env if k.startswith("AIRFLOW__")})
    wanted = [(s.lower(), o.lower()) for s, o in wanted]
    load_executor = HAVE_PG_DRIVERS and have_provider
    probe = run([sys.executable, "-c", _CONFIG_PROBE, json.dumps(wanted), "1" if load_executor else "0"], env)
    got = last_json(probe.stdout)
    expected = {f"{s}.{o}": env[f"AIRFLOW__{s.upper()}__{o.upper()}"] for s, o in wanted}
    assert got["values"] == expected
    assert got["values"]["core.executor"] == executor
    if load_executor:
        assert got["executor"] == executor
    if HAVE_PG_DRIVERS and variant == "celery":  # the real CLI: Airflow's normal start-up (engines made, not used)
        for section, option in (("core", "executor"), ("database", "sql_alchemy_conn")):
            out = run([AIRFLOW, "config", "get-value", section, option], env, timeout=120)
            assert out.stdout.strip() == env[f"AIRFLOW__{section.upper()}__{option.upper()}"]


# ------------------------------------------------------------------------------ (b) the DAGs parse in that mode
_DAGBAG_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
pools = sorted({t.pool for d in bag.dags.values() for t in d.tasks})
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids),
                  "pools": pools}))
"""


def ensure_dbt_manifest() -> None:
    """transforms/target/manifest.json current, as set-up and the image build leave it (`python -m transforms.runner
    manifest`). Without it Cosmos renders the transform DAG with `dbt ls` and caches the result in Airflow Variables,
    i.e. in the metadata database, at every parse."""
    project = REPO_ROOT / "transforms"
    manifest = project / "target" / "manifest.json"
    inputs = [project / "dbt_project.yml"]
    for folder in ("models", "macros", "seeds", "tests"):
        inputs += [p for p in (project / folder).rglob("*") if p.is_file()]
    newest = max(p.stat().st_mtime for p in inputs if p.exists())
    if manifest.exists() and manifest.stat().st_mtime >= newest:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    run([sys.executable, "-m", "transforms.runner", "manifest"], env, timeout=300)


def test_dags_parse_in_scale_out_mode(tmp_path):
    """Celery executor, PostgreSQL metadata database and broker that are not there (closed local ports), DuckLake
    warehouse whose catalog host does not exist: parsing needs none of them (given the dbt manifest of set-up)."""
    ensure_dbt_manifest()
    closed = f"127.0.0.1:{free_port()}"
    files = read_env_file(DEPLOY / "airflow.env")
    env = scale_out_env(
        tmp_path,
        ("airflow.env", "warehouse.env"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=with_host(files["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], closed),
        AIRFLOW__CELERY__RESULT_BACKEND=with_host(files["AIRFLOW__CELERY__RESULT_BACKEND"], closed),
        AIRFLOW__CELERY__BROKER_URL=f"redis://{closed}/0",
        AWS_ACCESS_KEY_ID="AKIATESTTESTTEST",
        AWS_SECRET_ACCESS_KEY="not-a-real-secret",
        DUCKLAKE_CATALOG_PASSWORD="not-a-real-password",
    )
    if not HAVE_PG_DRIVERS:
        env["_AIRFLOW__AS_LIBRARY"] = "1"
    started = time.monotonic()
    probe = run([sys.executable, "-c", _DAGBAG_PROBE, str(DAGS)], env, timeout=300)
    bag = last_json(probe.stdout)
    assert bag["errors"] == {}
    assert EXPECTED_DAGS <= set(bag["dags"])
    assert "warehouse" in bag["pools"]
    assert time.monotonic() - started < 120
    assert not list((tmp_path / "airflow_home").glob("*.db")), "parsing created a SQLite metadata database"


# ----------------------------------------------------------------------------------- (c) the warehouse target
DSN = "dbname=ducklake_catalog host=pg.internal port=5432 user=ducklake"


def lake_env(**extra: str) -> dict[str, str]:
    return {"WAREHOUSE_CATALOG": "ducklake", "DUCKLAKE_CATALOG_DSN": DSN, "DUCKLAKE_DATA_PATH": "/srv/lake/", **extra}


def test_local_mode_is_the_default():
    target = catalog.from_env({"WAREHOUSE_PATH": "/data/wh.duckdb"})
    assert target.mode == "duckdb" and target.is_local
    assert target.path == Path("/data/wh.duckdb") and target.database == "/data/wh.duckdb"
    assert catalog.connect_statements(target) == [] and target.config == {}
    assert catalog.from_env({"WAREHOUSE_CATALOG": " DuckDB ", "WAREHOUSE_PATH": "/x.duckdb"}).is_local
    relative = catalog.from_env({"WAREHOUSE_PATH": "var/other.duckdb"})
    assert relative.path == REPO_ROOT / "var" / "other.duckdb"
    assert catalog.from_env({}).path == REPO_ROOT / "var" / "warehouse.duckdb"


def test_local_mode_matches_warehouse_config(monkeypatch, tmp_path):
    from warehouse.config import warehouse_path

    monkeypatch.setenv("WAREHOUSE_PATH", str(tmp_path / "w.duckdb"))
    monkeypatch.delenv("WAREHOUSE_CATALOG", raising=False)
    assert catalog.from_env().path == warehouse_path()


def test_ducklake_statements_on_a_shared_path():
    target = catalog.from_env(lake_env())
    assert not target.is_local and target.database == ":memory:" and target.s3 is None
    assert catalog.connect_statements(target) == [
        "INSTALL ducklake",
        "LOAD ducklake",
        "INSTALL postgres",
        "LOAD postgres",
        f"ATTACH 'ducklake:postgres:{DSN}' AS warehouse (DATA_PATH '/srv/lake/')",
        "USE warehouse",
    ]
    assert catalog.connect_statements(target, read_only=True)[-2] == (
        f"ATTACH 'ducklake:postgres:{DSN}' AS warehouse (DATA_PATH '/srv/lake/', READ_ONLY)"
    )


def test_ducklake_statements_with_password_and_s3_keys():
    target = catalog.from_env(
        lake_env(
            DUCKLAKE_DATA_PATH="s3://planner-warehouse/lake/",
            DUCKLAKE_CATALOG_PASSWORD="pa'ss",
            AWS_ACCESS_KEY_ID="AKIAEXAMPLE12345",
            AWS_SECRET_ACCESS_KEY="s3cr3t/key",
            AWS_SESSION_TOKEN="tok3n",
            AWS_REGION="eu-west-1",
            S3_ENDPOINT="minio.storage:9000",
            S3_URL_STYLE="path",
            S3_USE_SSL="false",
        )
    )
    assert target.extensions == ["ducklake", "postgres", "httpfs"]
    assert catalog.connect_statements(target) == [
        "INSTALL ducklake",
        "LOAD ducklake",
        "INSTALL postgres",
        "LOAD postgres",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CREATE OR REPLACE SECRET warehouse_s3 (TYPE s3, PROVIDER config, KEY_ID 'AKIAEXAMPLE12345', "
        "SECRET 's3cr3t/key', SESSION_TOKEN 'tok3n', REGION 'eu-west-1', ENDPOINT 'minio.storage:9000', "
        "URL_STYLE 'path', USE_SSL false, SCOPE 's3://planner-warehouse')",
        "CREATE OR REPLACE SECRET warehouse_catalog (TYPE postgres, PASSWORD 'pa''ss')",
        f"ATTACH 'ducklake:postgres:{DSN}' AS warehouse "
        "(DATA_PATH 's3://planner-warehouse/lake/', META_SECRET 'warehouse_catalog')",
        "USE warehouse",
    ]


def test_ducklake_with_the_aws_credential_chain():
    target = catalog.from_env(
        lake_env(
            DUCKLAKE_DATA_PATH="s3://b/lake/",
            DUCKLAKE_S3_PROVIDER="credential_chain",
            AWS_REGION="us-east-2",
            AWS_ACCESS_KEY_ID="ignored-here",
        )
    )
    assert target.extensions == ["ducklake", "postgres", "httpfs", "aws"]
    assert (
        "CREATE OR REPLACE SECRET warehouse_s3 (TYPE s3, PROVIDER credential_chain, REGION 'us-east-2', SCOPE 's3://b')"
    ) in catalog.connect_statements(target)
    assert target.s3.key_id is None


def test_motherduck_target():
    target = catalog.from_env(
        {
            "WAREHOUSE_CATALOG": "motherduck",
            "MOTHERDUCK_DATABASE": "md:planner",
            "MOTHERDUCK_TOKEN": "eyJmotherducktoken",
            "DUCKDB_EXTENSION_DIRECTORY": "/opt/ext",
        }
    )
    assert target.database == "md:planner" and target.md_database == "planner"
    assert target.config == {"extension_directory": "/opt/ext", "motherduck_token": "eyJmotherducktoken"}
    assert catalog.connect_statements(target) == []
    assert target.extensions == ["motherduck"]


@pytest.mark.parametrize(
    "environ, missing",
    [
        ({"WAREHOUSE_CATALOG": "ducklake", "DUCKLAKE_DATA_PATH": "/srv/lake/"}, "DUCKLAKE_CATALOG_DSN"),
        ({"WAREHOUSE_CATALOG": "ducklake", "DUCKLAKE_CATALOG_DSN": DSN}, "DUCKLAKE_DATA_PATH"),
        (
            {"WAREHOUSE_CATALOG": "ducklake", "DUCKLAKE_CATALOG_DSN": " ", "DUCKLAKE_DATA_PATH": "/l/"},
            "DUCKLAKE_CATALOG_DSN",
        ),
        (lake_env(DUCKLAKE_DATA_PATH="s3://b/l/"), "AWS_ACCESS_KEY_ID"),
        (lake_env(DUCKLAKE_DATA_PATH="s3://b/l/", AWS_ACCESS_KEY_ID="AKIA1234"), "AWS_SECRET_ACCESS_KEY"),
        (lake_env(DUCKLAKE_DATA_PATH="s3://b/l/", AWS_SECRET_ACCESS_KEY="x"), "AWS_ACCESS_KEY_ID"),
        ({"WAREHOUSE_CATALOG": "motherduck", "MOTHERDUCK_TOKEN": "t"}, "MOTHERDUCK_DATABASE"),
        ({"WAREHOUSE_CATALOG": "motherduck", "MOTHERDUCK_DATABASE": "planner"}, "MOTHERDUCK_TOKEN"),
    ],
)
def test_missing_variables_are_named(environ, missing):
    with pytest.raises(catalog.CatalogConfigError, match=missing):
        catalog.from_env(environ)


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"WAREHOUSE_CATALOG": "iceberg"}, "WAREHOUSE_CATALOG"),
        ({"DUCKLAKE_DATA_PATH": "lake/"}, "DUCKLAKE_DATA_PATH"),
        ({"DUCKLAKE_DATA_PATH": "gs://bucket/lake/"}, "DUCKLAKE_DATA_PATH"),
        ({"DUCKLAKE_DATA_PATH": "s3:///lake/"}, "DUCKLAKE_DATA_PATH"),
        ({"DUCKLAKE_CATALOG_DSN": "postgres:dbname=x"}, "DUCKLAKE_CATALOG_DSN"),
        ({"DUCKLAKE_DATA_PATH": "s3://b/", "DUCKLAKE_S3_PROVIDER": "sso"}, "DUCKLAKE_S3_PROVIDER"),
        (
            {"DUCKLAKE_DATA_PATH": "s3://b/", "DUCKLAKE_S3_PROVIDER": "credential_chain", "S3_URL_STYLE": "x"},
            "S3_URL_STYLE",
        ),
        (
            {"DUCKLAKE_DATA_PATH": "s3://b/", "DUCKLAKE_S3_PROVIDER": "credential_chain", "S3_USE_SSL": "maybe"},
            "S3_USE_SSL",
        ),
        (
            {
                "DUCKLAKE_DATA_PATH": "s3://b/",
                "DUCKLAKE_S3_PROVIDER": "credential_chain",
                "S3_ENDPOINT": "http://m:9000",
            },
            "S3_ENDPOINT",
        ),
    ],
)
def test_bad_values_are_named(extra, named):
    with pytest.raises(catalog.CatalogConfigError, match=named):
        catalog.from_env(lake_env(**extra))


SECRET_VALUES = ("pa'ss word", "AKIAEXAMPLE12345", "s3cr3t/key", "tok3n-value")


def secret_target() -> catalog.WarehouseTarget:
    return catalog.from_env(
        lake_env(
            DUCKLAKE_DATA_PATH="s3://bucket/lake/",
            DUCKLAKE_CATALOG_PASSWORD=SECRET_VALUES[0],
            AWS_ACCESS_KEY_ID=SECRET_VALUES[1],
            AWS_SECRET_ACCESS_KEY=SECRET_VALUES[2],
            AWS_SESSION_TOKEN=SECRET_VALUES[3],
        )
    )


def test_secrets_are_redacted_everywhere():
    target = secret_target()
    shown = [repr(target), str(target), json.dumps(catalog.describe(target)), *catalog.redacted_statements(target)]
    for text in shown:
        for secret in SECRET_VALUES:
            assert secret not in text and secret.replace("'", "''") not in text, text
    assert catalog.describe(target)["s3"]["key_id"] == "AKIA***"
    assert any(secret in s for s in catalog.connect_statements(target) for secret in SECRET_VALUES)
    md = catalog.from_env({"WAREHOUSE_CATALOG": "motherduck", "MOTHERDUCK_DATABASE": "p", "MOTHERDUCK_TOKEN": "tokXYZ"})
    assert "tokXYZ" not in repr(md) and "tokXYZ" not in json.dumps(catalog.describe(md))


def test_passwords_inside_a_dsn_or_url_are_redacted():
    target = catalog.from_env(lake_env(DUCKLAKE_CATALOG_DSN="host=h user=u password='a b' dbname=d"))
    assert "a b" not in json.dumps(catalog.describe(target))
    assert catalog.redact("dbname=x password=hunter2 host=h") == "dbname=x password=*** host=h"
    assert catalog.redact("postgresql://u:hunter2@h/db") == "postgresql://u:***@h/db"


def test_connect_errors_carry_no_secrets(tmp_path):
    """A lake that cannot be attached (no extension installed in an empty extension directory and no network, or
    no server on the port): the error is CatalogConnectError, with DuckDB's message redacted."""
    target = catalog.from_env(
        lake_env(
            DUCKLAKE_CATALOG_DSN=f"host=127.0.0.1 port={free_port()} user=u password=dsnsecret1 dbname=d",
            DUCKLAKE_CATALOG_PASSWORD="catalogsecret2",
            DUCKDB_EXTENSION_DIRECTORY=str(tmp_path / "ext"),
        )
    )
    with pytest.raises(catalog.CatalogConnectError) as err:
        catalog.connect(target)
    assert "dsnsecret1" not in str(err.value) and "catalogsecret2" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_shipped_warehouse_env_files_parse():
    lake = read_env_file(DEPLOY / "warehouse.env")
    with pytest.raises(catalog.CatalogConfigError, match="AWS_ACCESS_KEY_ID"):
        catalog.from_env(lake)  # the keys are secrets: not in the file
    target = catalog.from_env({**lake, "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE12345", "AWS_SECRET_ACCESS_KEY": "x"})
    assert target.mode == "ducklake" and target.catalog_dsn == lake["DUCKLAKE_CATALOG_DSN"]
    assert target.data_path == lake["DUCKLAKE_DATA_PATH"] and target.s3.region == lake["AWS_REGION"]
    md = read_env_file(DEPLOY / "warehouse-motherduck.env")
    with pytest.raises(catalog.CatalogConfigError, match="MOTHERDUCK_TOKEN"):
        catalog.from_env(md)
    assert catalog.from_env({**md, "MOTHERDUCK_TOKEN": "t"}).database == f"md:{md['MOTHERDUCK_DATABASE']}"


def test_command_line_prints_one_redacted_json_document(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in catalog.ENV_VARS}
    env.update(lake_env(DUCKLAKE_CATALOG_PASSWORD="clisecret9"), PYTHONPATH=str(REPO_ROOT))
    for command in ("describe", "statements"):
        out = run([sys.executable, "-m", "warehouse", "catalog", command], env, timeout=60)
        assert "clisecret9" not in out.stdout
        assert json.loads(out.stdout)["mode"] == "ducklake"
    env.pop("DUCKLAKE_DATA_PATH")
    out = run([sys.executable, "-m", "warehouse", "catalog", "describe"], env, timeout=60, check=False)
    assert out.returncode == 2 and "DUCKLAKE_DATA_PATH" in json.loads(out.stdout)["error"]


def test_dbt_profile_matches_the_catalog():
    profile = yaml.safe_load((DEPLOY / "profiles.yml").read_text())
    project = yaml.safe_load((REPO_ROOT / "transforms" / "dbt_project.yml").read_text())
    outputs = profile[project["profile"]]["outputs"]
    assert {"ducklake", "ducklake_chain", "motherduck"} <= set(outputs)
    for name in ("ducklake", "ducklake_chain"):
        out = outputs[name]
        (attach,) = out["attach"]
        assert out["database"] == attach["alias"] == catalog.ALIAS
        assert attach["path"].startswith("ducklake:postgres:")
        assert attach["options"]["meta_secret"] == catalog.CATALOG_SECRET
        assert {s["name"] for s in out["secrets"]} == {catalog.CATALOG_SECRET, catalog.S3_SECRET}
        assert {"ducklake", "postgres", "httpfs"} <= set(out["extensions"])
    assert outputs["motherduck"]["path"].startswith("md:")
    text = (DEPLOY / "profiles.yml").read_text()
    for secret in ("DUCKLAKE_CATALOG_PASSWORD", "AWS_SECRET_ACCESS_KEY", "MOTHERDUCK_TOKEN"):
        assert f"env_var('{secret}'" in text


# --------------------------------------------------------- (d) a real PostgreSQL: metadata database and DuckLake
_METADATA_PROBE = r"""
import asyncio, json, sys
from sqlalchemy import text
from airflow import settings
from airflow.configuration import conf
with settings.engine.connect() as c:
    version = c.execute(text("select version()")).scalar()
    slots = c.execute(text("select slots from slot_pool where pool = 'warehouse'")).scalar()
async def async_check():
    async with settings.async_engine.connect() as c:
        value = (await c.execute(text("select 1"))).scalar()
    await settings.async_engine.dispose()  # inside the loop: asyncpg cannot close at interpreter exit
    return value
# the Celery result backend (a SQLAlchemy URL after "db+") reaches the same database with its own driver
from sqlalchemy import create_engine
backend = create_engine(conf.get("celery", "result_backend").removeprefix("db+"))
with backend.connect() as c:
    backend_ok = c.execute(text("select 1")).scalar()
backend.dispose()
out = {"server": version.split(",")[0], "pool_slots": slots, "async": asyncio.run(async_check()),
       "result_backend": backend_ok,
       "dialect": settings.engine.dialect.name, "driver": settings.engine.dialect.driver,
       "async_driver": settings.async_engine.dialect.driver, "executor": conf.get("core", "executor")}
if sys.argv[1] == "1":
    from airflow.executors.executor_loader import ExecutorLoader
    out["executor_class"] = ExecutorLoader.import_default_executor_cls()[0].__name__
print(json.dumps(out))
"""


@pytest.mark.skipif(not HAVE_PG_DRIVERS, reason=NO_DRIVER_REASON)
def test_airflow_metadata_database_on_postgres(postgres, tmp_path):
    """`airflow db migrate` with the scale-out settings against a real PostgreSQL (password only in PGPASSWORD),
    the `warehouse` pool imported from pools.json, sync and async engines connected."""
    files = read_env_file(DEPLOY / "airflow.env")
    server = f"127.0.0.1:{postgres['port']}"
    env = scale_out_env(
        tmp_path,
        ("airflow.env", "warehouse.env"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=with_host(files["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], server),
        AIRFLOW__CELERY__RESULT_BACKEND=with_host(files["AIRFLOW__CELERY__RESULT_BACKEND"], server),
        PGPASSWORD=postgres["password"],
    )
    run([AIRFLOW, "db", "migrate"], env, timeout=300)
    run([AIRFLOW, "pools", "import", str(DEPLOY / "pools.json")], env, timeout=120)
    run([AIRFLOW, "db", "check"], env, timeout=120)
    probe = last_json(run([sys.executable, "-c", _METADATA_PROBE, "1" if HAVE_CELERY else "0"], env).stdout)
    assert probe["server"].startswith("PostgreSQL")
    assert (probe["dialect"], probe["driver"], probe["async_driver"]) == ("postgresql", "psycopg2", "asyncpg")
    assert probe["async"] == 1 and probe["result_backend"] == 1
    assert probe["pool_slots"] == json.loads((DEPLOY / "pools.json").read_text())["warehouse"]["slots"]
    assert probe["executor"] == "CeleryExecutor"
    if HAVE_CELERY:
        assert probe["executor_class"] == "CeleryExecutor"


_LAKE_WRITER = r"""
import json, sys, time
from pathlib import Path
import pandas as pd
from warehouse import db
writer, other, batches, rows, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
def barrier(step):  # both writers connected: each batch's load begins together (the first race to create the table)
    (folder / f"{writer}.{step}").touch()
    deadline = time.monotonic() + 300
    while not (folder / f"{other}.{step}").exists():
        if (folder / f"{other}.end").exists() or time.monotonic() > deadline:
            raise SystemExit(f"writer {other} stopped before batch {step}")
        time.sleep(0.01)
spans = []
try:
    for b in range(batches):
        frame = pd.DataFrame({"n": range(b * rows, (b + 1) * rows), "writer": writer, "batch": b})
        began = time.time()
        with db.writer() as con:  # a connection per batch, as each ingest task opens its own
            barrier(b)
            result = db.load_batch(con, db.Batch("raw.two_writers", f"{writer}-{b}", "test", frame))
        spans.append([began, time.time()])
        assert result.rows == rows and not result.skipped_unchanged, result
finally:
    (folder / f"{writer}.end").touch()
print(json.dumps(spans))
"""


def test_ducklake_written_by_two_processes_at_once(extension_directory, postgres, tmp_path):
    """A DuckLake warehouse on the PostgreSQL catalog, written by two processes at once through warehouse.db
    (writer + load_batch, as every loader writes), each batch begun together behind a barrier of marker files:
    afterwards every row and every batch of both is there exactly once, and a read-only reader sees them but cannot
    write."""
    data = tmp_path / "lake"
    data.mkdir()
    environ = lake_env(
        DUCKLAKE_CATALOG_DSN=f"dbname=ducklake_catalog host=127.0.0.1 port={postgres['port']} user=ducklake",
        DUCKLAKE_CATALOG_PASSWORD=postgres["lake_password"],
        DUCKLAKE_DATA_PATH=f"{data}/",
        DUCKDB_EXTENSION_DIRECTORY=str(extension_directory),
    )
    target = catalog.from_env(environ)
    created = db.init_catalog(target)  # the lake in PostgreSQL, the warehouse's schemas and bookkeeping tables
    assert {"raw._batches", "quarantine.rejected_rows"} <= set(created["tables"])
    assert db.init_catalog(target)["tables"] == created["tables"]  # idempotent
    env = {k: v for k, v in os.environ.items() if k not in catalog.ENV_VARS}
    env.update(environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    batches, rows = 6, 500
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _LAKE_WRITER, name, other, str(batches), str(rows), str(barrier)],
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, other in (("a", "b"), ("b", "a"))
    ]
    spans = []
    try:
        for proc in writers:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            spans.append(last_json_list(out))
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (a_first, a_last), (b_first, b_last) = ((s[0][0], s[-1][1]) for s in spans)
    assert a_first < b_last and b_first < a_last, f"the writers did not overlap: {spans}"
    reader = catalog.connect(target, read_only=True)
    try:
        per_writer = reader.execute(
            "SELECT writer, count(*), count(DISTINCT n), min(n), max(n), count(DISTINCT batch) "
            "FROM raw.two_writers GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert per_writer == [(w, batches * rows, batches * rows, 0, batches * rows - 1, batches) for w in "ab"]
        duplicates = reader.execute(
            "SELECT count(*) FROM (SELECT writer, n FROM raw.two_writers GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]
        assert duplicates == 0
        booked = reader.execute(
            "SELECT batch_id, row_count FROM raw._batches WHERE table_name = 'raw.two_writers' ORDER BY 1"
        ).fetchall()
        assert booked == sorted((f"{w}-{b}", rows) for w in "ab" for b in range(batches))
        assert reader.execute("SELECT current_database()").fetchone()[0] == catalog.ALIAS
        with pytest.raises(Exception, match="(?i)read.only"):
            reader.execute("INSERT INTO raw.two_writers (n, writer, batch) VALUES (0, 'reader', 0)")
    finally:
        reader.close()


def last_json_list(text: str) -> list:
    """The last line of `text` that is a JSON list."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("["):
            return json.loads(line)
    raise AssertionError(f"no JSON list in:\n{text[-2000:]}")


def test_dbt_connects_with_the_scale_out_profile(extension_directory, postgres, tmp_path):
    """`dbt debug` with deploy/scale-out/profiles.yml (target ducklake): the profile renders from the environment
    and dbt-duckdb attaches the lake through the same catalog secret."""
    if not importlib.util.find_spec("duckdb_extension_httpfs"):
        pytest.skip("the httpfs extension package (duckdb-extension-httpfs) is not installed")
    env = {k: v for k, v in os.environ.items() if k not in catalog.ENV_VARS and not k.startswith("DBT_")}
    env.update(
        DUCKLAKE_CATALOG_DSN=f"dbname=ducklake_catalog host=127.0.0.1 port={postgres['port']} user=ducklake",
        DUCKLAKE_CATALOG_PASSWORD=postgres["lake_password"],
        DUCKLAKE_DATA_PATH=f"{tmp_path / 'dbt_lake'}/",
        DUCKDB_EXTENSION_DIRECTORY=str(extension_directory),
        DBT_SEND_ANONYMOUS_USAGE_STATS="False",
        DBT_TARGET_PATH=str(tmp_path / "target"),
        PYTHONPATH=str(REPO_ROOT),
    )
    # its own catalog database: a lake keeps the DATA_PATH it was created with
    create_database(postgres, "ducklake_dbt")
    env["DUCKLAKE_CATALOG_DSN"] = env["DUCKLAKE_CATALOG_DSN"].replace("dbname=ducklake_catalog", "dbname=ducklake_dbt")
    out = run(
        [
            str(BIN / "dbt"),
            "debug",
            "--project-dir",
            str(REPO_ROOT / "transforms"),
            "--profiles-dir",
            str(DEPLOY),
            "--target",
            "ducklake",
            "--log-path",
            str(tmp_path / "logs"),
        ],
        env,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0 and "All checks passed" in out.stdout, out.stdout[-3000:]
    assert postgres["lake_password"] not in out.stdout


def test_warehouse_writer_and_reader_on_ducklake(extension_directory, postgres, tmp_path, monkeypatch):
    """warehouse.db's writer/reader/load_batch on DuckLake (the bookkeeping tables without the primary key DuckLake
    lacks, warehouse.db.SHARED_DDL): an idempotent batch load through the shared catalog, read back read-only."""
    import pandas as pd

    from warehouse import db

    for key, value in lake_on(postgres, "ducklake_writer", tmp_path / "lake", extension_directory).items():
        monkeypatch.setenv(key, value)
    batch = db.Batch(
        "raw.scale_out_probe",
        "probe-1",
        "test",
        pd.DataFrame({"x": [1, 2, 3]}),
        [db.Rejection("bad value", file="f.csv", row_number=4, field="x", value="?")],
    )
    with db.writer() as con:
        first = db.load_batch(con, batch)
        again = db.load_batch(con, batch)
    assert (first.rows, first.rejected, first.skipped_unchanged) == (3, 1, False)
    assert again.skipped_unchanged
    with db.writer() as con:  # changed content replaces the batch (delete-insert, no PRIMARY KEY needed)
        db.load_batch(con, db.Batch("raw.scale_out_probe", "probe-1", "test", pd.DataFrame({"x": [7, 8]})))
    with db.reader() as con:
        assert con.execute("SELECT sum(x), count(*) FROM raw.scale_out_probe").fetchone() == (15, 2)
        assert con.execute("SELECT count(*) FROM raw._batches WHERE batch_id = 'probe-1'").fetchone() == (1,)
        assert con.execute("SELECT count(*) FROM quarantine.rejected_rows").fetchone() == (0,)


def test_the_hourly_loop_on_ducklake(extension_directory, postgres, tmp_path, data_dir, monkeypatch):
    """The planner's own stores on DuckLake (no PRIMARY KEY or CHECK there, `warehouse.db.create_tables`): grid data
    ingested and built by dbt into the lake (transforms.runner picks the scale-out profile), jobs submitted, four
    loop hours with the replay executor, then the ledger built by dbt; re-running the last hour changes nothing."""
    from scheduling import loop
    from scheduling.output.ledger import LEDGER_SELECT
    from scheduling.queue import store
    from scheduling.queue.intake import submit_mappings
    from transforms.runner import build
    from warehouse.ingest import ingest

    for key, value in lake_on(postgres, "ducklake_loop", tmp_path / "lake", extension_directory).items():
        monkeypatch.setenv(key, value)
    fleet = {
        "version": 1,
        "regions": {"us-west": {"zone": "CISO"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [{"name": "usw-v100", "region": "us-west", "gpu_model": "V100",
                      "nodes": [{"name": "n1", "gpus": 4, "cpus": 32, "memory_gib": 256}]}],
    }  # fmt: skip
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    monkeypatch.setenv("FLEET_PATH", str(tmp_path / "fleet.yaml"))
    t0 = "2021-07-15T12:00Z"
    timings = {}
    began = time.monotonic()
    ingest(["grid_ensembleci"], data_dir=data_dir, progress=False)
    build(select="+grid_hourly", target_path=tmp_path / "target")
    timings["ingest+dbt"] = time.monotonic() - began
    jobs = [
        {"tenant": "lab", "job_id": f"j{i}", "submitted_at": "2021-07-15T11:30Z", "gpus": 1, "cpu_milli": 1000,
         "memory_mib": 1024, "job_type": "ResNet-50 (batch size 64)", "est_duration_h": 0.5 + i % 2,
         "deadline": "2021-07-15T15:30Z", "home_region": "us-west"}
        for i in range(6)
    ]  # fmt: skip
    assert submit_mappings(jobs, source="test", as_of=t0, data_dir=data_dir).counts["accepted"] == 6
    began = time.monotonic()
    run = {"data_dir": data_dir, "schedule_root": tmp_path / "schedules"}
    results = loop.run_hours(t0, 4, **run)
    timings["4 loop hours"] = time.monotonic() - began
    assert sum(r.dispatch["sent"] for r in results) >= 1
    before = store.table_digest()
    with db.reader() as con:
        plans = con.execute("SELECT count(*) FROM plan.plans").fetchone()[0]
        log = con.execute("SELECT count(*) FROM plan.dispatch_log").fetchone()[0]
    loop.run_hour(results[-1].plan_time, **run)
    assert store.table_digest() == before
    with db.reader() as con:
        assert con.execute("SELECT count(*) FROM plan.plans").fetchone()[0] == plans == 4
        assert con.execute("SELECT count(*) FROM plan.dispatch_log").fetchone()[0] == log
    began = time.monotonic()
    build(select=list(LEDGER_SELECT), target_path=tmp_path / "target")
    timings["ledger dbt"] = time.monotonic() - began
    with db.reader() as con:
        runs = con.execute("SELECT count(*), count(realized_kgco2e) FROM marts.job_runs").fetchone()
        states = dict(con.execute("SELECT state, count(*) FROM queue.jobs GROUP BY 1").fetchall())
    assert runs[0] == log and runs[1] >= sum(states.get(s, 0) for s in ("finished",))
    print(json.dumps({"timings_s": {k: round(v, 1) for k, v in timings.items()}, "states": states}))
