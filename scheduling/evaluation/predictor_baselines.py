"""Baselines for the three evaluation protocols: mean per job type, matrix factorization, LightGBM.

Every baseline sees exactly the training rows network 1 sees, in log space, and predicts the same cells.

* Mean per job type — isolated: the job's mean log throughput over its observed GPU types plus the average
  GPU-type offset of the training jobs (without the offset a job-mean would ignore 4x K80/V100 gaps);
  co-located: the job's mean normalized throughput over its training partners on that GPU type.
* Matrix factorization — isolated: jobs x GPU types matrix of log steps/s, biases + rank-1 factors (ridge 1.0);
  co-located: per GPU type, a job x partner matrix of log normalized throughput, biases + rank-2 factors
  (ridge 0.1). Ridge weights and ranks picked from {0.01, 0.1, 1} x {1, 2(, 3)} on two folds.
  Fitted by alternating ridge regressions (numpy, seeded).
* LightGBM — isolated: job features, GPU type, and the job's log throughput on each *other* GPU type (the
  target GPU's own column masked everywhere it is held out), so the booster gets the same "fingerprint" the
  network gets; co-located: job and partner features and identities, GPU type, both isolated log throughputs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scheduling.models.performance.features import FAMILIES, GPU_TYPES, PerfTables

LGB_PARAMS = dict(
    n_estimators=400,
    learning_rate=0.03,
    num_leaves=15,
    min_child_samples=5,
    subsample=0.8,
    subsample_freq=1,
    colsample_bytree=0.8,
    reg_lambda=1.0,
    n_jobs=1,
    verbose=-1,
)


def _lgbm(seed: int):
    import lightgbm  # noqa: PLC0415 - LightGBM loads only for its baseline

    return lightgbm.LGBMRegressor(random_state=seed, deterministic=True, force_row_wise=True, **LGB_PARAMS)


# --- isolated throughput (protocol 2) -------------------------------------------------------------------------


def iso_mean_per_job(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """log steps/s; train/test: job_key, gpu_type (+ log_y in train)."""
    gpu_mean = train.groupby("gpu_type").log_y.mean()
    centred = train.log_y - train.gpu_type.map(gpu_mean)
    job_level = centred.groupby(train.job_key).mean()
    base = test.job_key.map(job_level).fillna(0.0)
    return (base + test.gpu_type.map(gpu_mean)).to_numpy(dtype=float)


def als_fit(
    rows: np.ndarray,
    cols: np.ndarray,
    y: np.ndarray,
    n_rows: int,
    n_cols: int,
    rank: int,
    l2: float,
    iters: int = 30,
    seed: int = 0,
) -> dict:
    """Biased matrix factorization y ~ mu + b_r + c_c + p_r . q_c by alternating ridge regressions (numpy,
    deterministic for a seed). Rows/columns without data keep zero bias and factors."""
    rng = np.random.default_rng(seed)
    mu = float(np.mean(y))
    br, bc = np.zeros(n_rows), np.zeros(n_cols)
    p = 0.1 * rng.standard_normal((n_rows, rank))
    q = 0.1 * rng.standard_normal((n_cols, rank))
    reg = l2 * np.diag([0.1] + [1.0] * rank)
    by_row = [np.flatnonzero(rows == i) for i in range(n_rows)]
    by_col = [np.flatnonzero(cols == j) for j in range(n_cols)]
    for _ in range(iters):
        for i, m in enumerate(by_row):
            if len(m):
                x = np.hstack([np.ones((len(m), 1)), q[cols[m]]])
                sol = np.linalg.solve(x.T @ x + reg, x.T @ (y[m] - mu - bc[cols[m]]))
                br[i], p[i] = sol[0], sol[1:]
        for j, m in enumerate(by_col):
            if len(m):
                x = np.hstack([np.ones((len(m), 1)), p[rows[m]]])
                sol = np.linalg.solve(x.T @ x + reg, x.T @ (y[m] - mu - br[rows[m]]))
                bc[j], q[j] = sol[0], sol[1:]
    return dict(mu=mu, br=br, bc=bc, p=p, q=q, reg=reg, rank=rank)


def als_predict(model: dict, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return model["mu"] + model["br"][rows] + model["bc"][cols] + (model["p"][rows] * model["q"][cols]).sum(1)


def als_fold_in(model: dict, obs_cols: np.ndarray, obs_y: np.ndarray, new_cols: np.ndarray) -> np.ndarray:
    """Prediction for a new row from a few observed entries: ridge solve for its bias and factors."""
    base = model["mu"] + model["bc"][new_cols]
    if len(obs_cols) == 0:
        return base
    x = np.hstack([np.ones((len(obs_cols), 1)), model["q"][obs_cols]])
    sol = np.linalg.solve(x.T @ x + model["reg"], x.T @ (obs_y - model["mu"] - model["bc"][obs_cols]))
    return base + sol[0] + model["q"][new_cols] @ sol[1:]


def iso_matrix_factorization(
    train: pd.DataFrame, test: pd.DataFrame, rank: int = 1, l2: float = 1.0, seed: int = 0
) -> np.ndarray:
    keys = sorted(set(train.job_key) | set(test.job_key))
    kidx = {k: i for i, k in enumerate(keys)}
    gidx = {g: i for i, g in enumerate(GPU_TYPES)}
    model = als_fit(
        np.array([kidx[k] for k in train.job_key]),
        np.array([gidx[g] for g in train.gpu_type]),
        train.log_y.to_numpy(),
        len(keys),
        len(GPU_TYPES),
        rank,
        l2,
        seed=seed,
    )
    return als_predict(model, np.array([kidx[k] for k in test.job_key]), np.array([gidx[g] for g in test.gpu_type]))


def _job_numeric(jobs: pd.DataFrame, keys) -> pd.DataFrame:
    j = jobs.loc[list(keys)]
    return pd.DataFrame(
        {
            "family": pd.Categorical(j.model_family.to_numpy(), categories=list(FAMILIES)).codes,
            "log_bs": np.log2(pd.to_numeric(j.batch_size, errors="coerce").to_numpy(dtype=float)),
            "log_scale": np.log2(j.scale_factor.to_numpy(dtype=float)),
            "spread": (~j.consolidated.to_numpy(dtype=bool)).astype(float),
        }
    )


def iso_lightgbm(tables: PerfTables, train: pd.DataFrame, test: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """`train` holds the visible isolated rows; a job's log throughput on other GPUs comes only from `train`."""
    wide = train.pivot_table(index="job_key", columns="gpu_type", values="log_y")

    def frame(rows: pd.DataFrame) -> pd.DataFrame:
        out = _job_numeric(tables.jobs, rows.job_key)
        out["gpu"] = [GPU_TYPES.index(g) for g in rows.gpu_type]
        for g in GPU_TYPES:
            col = wide[g] if g in wide else pd.Series(dtype=float)
            values = rows.job_key.map(col).to_numpy(dtype=float)
            out[f"log_{g}"] = np.where(rows.gpu_type.to_numpy() == g, np.nan, values)  # never its own target
        return out

    model = _lgbm(seed)
    model.fit(frame(train), train.log_y.to_numpy(), categorical_feature=["family", "gpu"])
    return model.predict(frame(test)).astype(float)


# --- co-located normalized throughput (protocol 1) -------------------------------------------------------------


def pair_mean_per_job(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """log normalized throughput; mean over the job's training partners on the GPU (fallback: job, GPU, all)."""
    by_job_gpu = train.groupby(["job_key", "gpu_type"]).log_norm.mean()
    by_gpu = train.groupby("gpu_type").log_norm.mean()
    idx = pd.MultiIndex.from_arrays([test.job_key, test.gpu_type])
    out = by_job_gpu.reindex(idx).to_numpy()
    fallback = test.gpu_type.map(by_gpu).to_numpy()
    return np.where(np.isfinite(out), out, fallback).astype(float)


def pair_matrix_factorization(
    train: pd.DataFrame, test: pd.DataFrame, rank: int = 2, l2: float = 0.1, seed: int = 0
) -> np.ndarray:
    """Per GPU type: log norm(A | B) = mu + a_A + b_B + p_A . q_B."""
    out = np.zeros(len(test))
    keys = sorted(set(train.job_key) | set(train.partner_key) | set(test.job_key) | set(test.partner_key))
    kidx = {k: i for i, k in enumerate(keys)}
    for g in GPU_TYPES:
        tr = train[train.gpu_type == g]
        mask = (test.gpu_type == g).to_numpy()
        if not mask.any():
            continue
        te = test[mask]
        model = als_fit(
            np.array([kidx[k] for k in tr.job_key]),
            np.array([kidx[k] for k in tr.partner_key]),
            tr.log_norm.to_numpy(),
            len(keys),
            len(keys),
            rank,
            l2,
            seed=seed,
        )
        out[mask] = als_predict(
            model, np.array([kidx[k] for k in te.job_key]), np.array([kidx[k] for k in te.partner_key])
        )
    return np.minimum(out, 0.0)


def pair_lightgbm(
    tables: PerfTables, iso: pd.DataFrame, train: pd.DataFrame, test: pd.DataFrame, seed: int = 0
) -> np.ndarray:
    keys = sorted(tables.jobs.index)
    kidx = {k: i for i, k in enumerate(keys)}
    iso_log = iso.set_index(["job_key", "gpu_type"]).log_y

    def frame(rows: pd.DataFrame) -> pd.DataFrame:
        a = _job_numeric(tables.jobs, rows.job_key).add_prefix("a_")
        b = _job_numeric(tables.jobs, rows.partner_key).add_prefix("b_")
        out = pd.concat([a, b], axis=1)
        out["a_id"] = [kidx[k] for k in rows.job_key]
        out["b_id"] = [kidx[k] for k in rows.partner_key]
        out["gpu"] = [GPU_TYPES.index(g) for g in rows.gpu_type]
        out["a_log_iso"] = iso_log.reindex(pd.MultiIndex.from_arrays([rows.job_key, rows.gpu_type])).to_numpy()
        out["b_log_iso"] = iso_log.reindex(pd.MultiIndex.from_arrays([rows.partner_key, rows.gpu_type])).to_numpy()
        return out

    model = _lgbm(seed)
    cats = ["a_family", "b_family", "a_id", "b_id", "gpu"]
    model.fit(frame(train), train.log_norm.to_numpy(), categorical_feature=cats)
    return np.minimum(model.predict(frame(test)).astype(float), 0.0)
