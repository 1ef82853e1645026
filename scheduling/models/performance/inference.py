"""The predictor's prediction side in numpy: what the hourly plan runs, without importing torch.

    runtime = PredictorRuntime.load(artifact_dir)          # prior.pt / refiner.pt read by `weights.read_state`
    runtime.copy().observe(feedback_rows)                  # runtime feedback, as PerformancePredictor.observe
    runtime.isolated(jobs, "v100")                         # steps/s, the numbers the torch networks give

`PriorRuntime` is network 1's forward pass (`prior.PriorNet`), `RefinerRuntime` network 2's posterior
(`refiner.RefinerNet.posterior`), both in float32 with the operations in the torch order, so they agree with the
torch networks to float32 rounding. `PredictorRuntime` holds the feedback and the predictions built from the two
networks (`isolated`, `colocated`, `predict_cells`); `predictor.PerformancePredictor` adds training, the refiner's
re-fit and saving on top of it with the torch networks.
"""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import linalg

from scheduling.models.measured import parse_job_type
from scheduling.models.performance.features import (
    GPU_TYPES,
    N_CELL_FEATURES,
    N_JOB_FEATURES,
    N_TYPE_FEATURES,
    Vocab,
    cell_features,
    job_features,
    job_key,
    normalise_jobs,
)
from scheduling.models.performance.feedback import attach_prior
from scheduling.models.performance.weights import WeightsError, read_state

F32 = np.float32
N_SHAPE_FEATURES = N_JOB_FEATURES - N_TYPE_FEATURES
N_KERNEL_SCALES = 7  # log_s: job, gpu, mode, partner, partner family, noise (co-located), noise (isolated)
FEEDBACK_COLUMNS = [
    "job_key",
    "job_type",
    "model_family",
    "batch_size",
    "scale_factor",
    "consolidated",
    "gpu_type",
    "partner_job_type",
    "steps_per_s",
]


def as_jobs(jobs) -> pd.DataFrame:
    """Normalise a job description (DataFrame, dict, or list of dicts) to the columns network 1 needs."""
    if isinstance(jobs, dict):
        jobs = [jobs]
    frame = pd.DataFrame(jobs).reset_index(drop=True)
    if "job_type" not in frame:
        raise ValueError("a job needs a job_type (e.g. 'ResNet-50 (batch size 64)')")
    parsed = [parse_job_type(t) for t in frame.job_type]
    if "model_family" not in frame:
        frame["model_family"] = [p[0] for p in parsed]
    if "batch_size" not in frame:
        frame["batch_size"] = [p[1] for p in parsed]
    frame["scale_factor"] = frame["scale_factor"].fillna(1).astype(int) if "scale_factor" in frame else 1
    frame["consolidated"] = frame["consolidated"].fillna(True).astype(bool) if "consolidated" in frame else True
    frame["job_key"] = [job_key(t, s, c) for t, s, c in zip(frame.job_type, frame.scale_factor, frame.consolidated)]
    return frame


# ------------------------------------------------------------------------------------------------ layers


def _linear(state: dict, name: str, x: np.ndarray) -> np.ndarray:
    """torch.nn.Linear: x W^T + b."""
    out = x @ state[f"{name}.weight"].T
    bias = state.get(f"{name}.bias")
    return out if bias is None else out + bias


def _silu(x: np.ndarray) -> np.ndarray:
    """SiLU: x sigmoid(x) = x / (1 + exp(-x))."""
    return x / (F32(1.0) + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20): log(1 + exp(x)), and x itself above 20."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, F32(20.0)))))


def _mlp(state: dict, name: str, x: np.ndarray) -> np.ndarray:
    """The prior's `_mlp`: Linear, SiLU, Linear, SiLU, Linear (modules 0, 2, 4)."""
    h = _silu(_linear(state, f"{name}.0", x))
    h = _silu(_linear(state, f"{name}.2", h))
    return _linear(state, f"{name}.4", h)


def _mlp_shapes(name: str, n_in: int, hidden: int, n_out: int) -> dict[str, tuple]:
    return {
        f"{name}.0.weight": (hidden, n_in),
        f"{name}.0.bias": (hidden,),
        f"{name}.2.weight": (hidden, hidden),
        f"{name}.2.bias": (hidden,),
        f"{name}.4.weight": (n_out, hidden),
        f"{name}.4.bias": (n_out,),
    }


def _checked(state, expected: dict[str, tuple], path: Path) -> dict[str, np.ndarray]:
    """`state` when it is a dict of float32 arrays with exactly the `expected` names and shapes; else WeightsError
    naming the file and the first difference."""
    if not isinstance(state, dict):
        raise WeightsError(f"{path}: expected a state dict, found {type(state).__name__}")
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise WeightsError(f"{path}: state dict does not match the network (missing {missing}, unexpected {extra})")
    for name, shape in expected.items():
        value = state[name]
        if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != shape:
            found = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
            raise WeightsError(f"{path}: {name} is {found}, expected float32 {shape}")
    return dict(state)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from exc


# ------------------------------------------------------------------------------------------------ network 1


class PriorRuntime:
    """Network 1's predictions (`prior.PriorModel.predict_log_isolated` / `predict_log_norm`) from its weights:
    an ensemble of `PriorNet` state dicts, averaged in log space."""

    def __init__(self, nets: list[dict], vocab: Vocab, iso_mean: float, iso_std: float, job_bias: bool = True):
        self.nets, self.vocab = nets, vocab
        self.iso_mean, self.iso_std, self.job_bias = float(iso_mean), float(iso_std), bool(job_bias)

    @classmethod
    def load(cls, directory: Path | str) -> PriorRuntime:
        """prior.json (config, vocabularies, iso normalisation) and prior.pt (a list of PriorNet state dicts)."""
        directory = Path(directory)
        meta = _read_json(directory / "prior.json")
        try:
            cfg, vocab = meta["config"], Vocab(**meta["vocab"])
            dim, hidden = int(cfg["dim"]), int(cfg["hidden"])
            iso_mean, iso_std, job_bias = float(meta["iso_mean"]), float(meta["iso_std"]), bool(cfg["job_bias"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightsError(f"{directory / 'prior.json'}: incomplete ({type(exc).__name__}: {exc})") from exc
        n_types, n_keys, n_gpus = len(vocab.types), len(vocab.keys), len(vocab.gpus)
        expected = {
            **_mlp_shapes("type_feat", N_TYPE_FEATURES, hidden, dim),
            "shape_proj.weight": (dim, N_SHAPE_FEATURES),
            "type_emb.weight": (n_types + 1, dim),
            "pair_type_emb.weight": (n_types + 1, dim),
            "key_emb.weight": (n_keys + 1, dim),
            "type_bias.weight": (n_types + 1, 1),
            "key_bias.weight": (n_keys + 1, 1),
            "gpu_emb.weight": (n_gpus, dim),
            **_mlp_shapes("level_head", 3 * dim, hidden, 1),
            **_mlp_shapes("scale_head", 3 * dim + N_SHAPE_FEATURES, hidden, 1),
            **_mlp_shapes("pair_head", 6 * dim, hidden, 1),
        }
        path = directory / "prior.pt"
        states = read_state(path)
        if not isinstance(states, list) or not states:
            raise WeightsError(f"{path}: expected a non-empty list of state dicts, found {type(states).__name__}")
        return cls([_checked(s, expected, path) for s in states], vocab, iso_mean, iso_std, job_bias)

    def _inputs(self, jobs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        frame = normalise_jobs(jobs)
        return job_features(frame), self.vocab.type_index(frame.job_type), self.vocab.key_index(frame.job_key)

    def _gpus(self, gpu_types, n: int) -> np.ndarray:
        return self.vocab.gpu_index([gpu_types] * n if isinstance(gpu_types, str) else list(gpu_types))

    def _encode(self, net: dict, x: np.ndarray, t: np.ndarray, k: np.ndarray):
        """(type code z_t, job code z, shape features, bias, multi-GPU flag):
        z_t = f(type features) + e_type[t];  z = z_t + e'_type[t] + W shape + e_key[k];  bias = b_type[t] + b_key[k]
        (unknown types and keys index the zero padding rows)."""
        shape = x[:, N_TYPE_FEATURES:]
        zt = _mlp(net, "type_feat", x[:, :N_TYPE_FEATURES]) + net["type_emb.weight"][t]
        z = zt + net["pair_type_emb.weight"][t] + _linear(net, "shape_proj", shape) + net["key_emb.weight"][k]
        bias = (net["type_bias.weight"][t] + net["key_bias.weight"][k])[:, 0]
        if not self.job_bias:
            bias = np.zeros_like(bias)
        multi = (x[:, N_TYPE_FEATURES] > 0).astype(F32)
        return zt, z, shape, bias, multi

    def _iso(self, net: dict, code, g: np.ndarray) -> np.ndarray:
        """Standardised log isolated throughput: A([z_t, u, z_t u]) + [multi] S([z_t, shape, u, z_t u]) + bias."""
        zt, _z, shape, bias, multi = code
        u = net["gpu_emb.weight"][g]
        level = _mlp(net, "level_head", np.concatenate([zt, u, zt * u], axis=-1))[:, 0]
        speedup = _mlp(net, "scale_head", np.concatenate([zt, shape, u, zt * u], axis=-1))[:, 0]
        return level + multi * speedup + bias

    def _log_norm(self, net: dict, code_a, code_b, g: np.ndarray) -> np.ndarray:
        """Log normalised throughput of A next to B: -softplus(h([z_A, z_A+z_B, z_A z_B, |z_A-z_B|, u, z_A u]))."""
        za, zb = code_a[1], code_b[1]
        u = net["gpu_emb.weight"][g]
        h = _mlp(net, "pair_head", np.concatenate([za, za + zb, za * zb, np.abs(za - zb), u, za * u], axis=-1))
        return -_softplus(h[:, 0])

    def predict_log_isolated(self, jobs: pd.DataFrame, gpu_types) -> np.ndarray:
        """Log steps/s of each job on the matching GPU type: mean over the ensemble x iso_std + iso_mean."""
        x, t, k = self._inputs(jobs)
        g = self._gpus(gpu_types, len(jobs))
        out = np.stack([self._iso(net, self._encode(net, x, t, k), g) for net in self.nets]).mean(0)
        return (out * F32(self.iso_std) + F32(self.iso_mean)).astype(float)

    def predict_isolated(self, jobs: pd.DataFrame, gpu_types) -> np.ndarray:
        return np.exp(self.predict_log_isolated(jobs, gpu_types))

    def predict_log_norm(self, jobs_a: pd.DataFrame, jobs_b: pd.DataFrame, gpu_types) -> np.ndarray:
        """Log normalized throughput of job A (rows of jobs_a) co-located with B, averaged over the ensemble."""
        a, b = self._inputs(jobs_a), self._inputs(jobs_b)
        g = self._gpus(gpu_types, len(jobs_a))
        out = [self._log_norm(net, self._encode(net, *a), self._encode(net, *b), g) for net in self.nets]
        return np.stack(out).mean(0).astype(float)

    def predict_norm(self, jobs_a, jobs_b, gpu_types) -> np.ndarray:
        return np.exp(self.predict_log_norm(jobs_a, jobs_b, gpu_types))


# ------------------------------------------------------------------------------------------------ network 2


class _CellArrays:
    """One job's cells as arrays: features, GPU index, co-located flag, partner and partner-family codes."""

    def __init__(self, cells: pd.DataFrame):
        self.x = cell_features(cells)
        self.gpu = np.array([GPU_TYPES.index(g) for g in cells["gpu_type"]], dtype=np.int64)
        partner = cells["partner_job_type"].to_numpy(dtype=object)
        co = np.array([isinstance(p, str) and p != "" for p in partner], dtype=bool)
        self.co = co.astype(F32)
        self.partner = pd.factorize(pd.Series([p if c else "" for p, c in zip(partner, co)], dtype=object))[0]
        fams = [parse_job_type(p)[0] if c else "" for p, c in zip(partner, co)]
        self.pfam = pd.factorize(pd.Series(fams, dtype=object))[0]

    def take(self, rows: slice) -> _CellArrays:
        out = object.__new__(_CellArrays)
        out.x, out.gpu, out.co = self.x[rows], self.gpu[rows], self.co[rows]
        out.partner, out.pfam = self.partner[rows], self.pfam[rows]
        return out

    def __len__(self) -> int:
        return len(self.gpu)


class RefinerRuntime:
    """Network 2's posterior (`refiner.Refiner.predict`) from a RefinerNet state dict."""

    def __init__(self, state: dict, mean_kind: str = "none", deep_dim: int = 4):
        self.state, self.mean_kind, self.deep_dim = state, mean_kind, int(deep_dim)
        self.s2 = np.exp(F32(2.0) * state["log_s"])  # squared scales of the kernel terms and the noise

    @classmethod
    def load(cls, directory: Path | str) -> RefinerRuntime:
        """refiner.json (config) and refiner.pt (one RefinerNet state dict)."""
        directory = Path(directory)
        meta = _read_json(directory / "refiner.json")
        try:
            cfg = meta["config"]
            mean_hidden, hidden, deep_dim, mean_kind = (
                int(cfg["mean_hidden"]),
                int(cfg["hidden"]),
                int(cfg["deep_dim"]),
                str(cfg["mean"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightsError(f"{directory / 'refiner.json'}: incomplete ({type(exc).__name__}: {exc})") from exc
        if mean_kind not in ("none", "cell", "gpu_mode"):
            raise WeightsError(f"{directory / 'refiner.json'}: unknown mean {mean_kind!r}")
        mean = (
            {
                "mean.0.weight": (mean_hidden, N_CELL_FEATURES),
                "mean.0.bias": (mean_hidden,),
                "mean.2.weight": (1, mean_hidden),
                "mean.2.bias": (1,),
            }
            if mean_hidden
            else {"mean.0.weight": (1, N_CELL_FEATURES), "mean.0.bias": (1,)}
        )
        expected = {
            "log_s": (N_KERNEL_SCALES,),
            "gpu_mode_mask": (N_CELL_FEATURES,),
            **mean,
            "deep.0.weight": (hidden, N_CELL_FEATURES),
            "deep.0.bias": (hidden,),
            "deep.2.weight": (max(deep_dim, 1), hidden),
            "deep.2.bias": (max(deep_dim, 1),),
        }
        path = directory / "refiner.pt"
        return cls(_checked(read_state(path), expected, path), mean_kind, deep_dim)

    def _m(self, c: _CellArrays) -> np.ndarray:
        """The GP's mean m(cell): zero, or the mean network on the cell features (masked to GPU x mode)."""
        if self.mean_kind == "none":
            return np.zeros(len(c), dtype=F32)
        x = c.x if self.mean_kind == "cell" else c.x * self.state["gpu_mode_mask"]
        if "mean.2.weight" in self.state:
            return _linear(self.state, "mean.2", _silu(_linear(self.state, "mean.0", x)))[:, 0]
        return _linear(self.state, "mean.0", x)[:, 0]

    def _deep(self, x: np.ndarray) -> np.ndarray:
        """The deep kernel's features h(cell): Linear, SiLU, Linear."""
        return _linear(self.state, "deep.2", _silu(_linear(self.state, "deep.0", x)))

    def _kernel(self, a: _CellArrays, b: _CellArrays) -> np.ndarray:
        """k = s_job^2 + s_gpu^2 [g=g'] + s_mode^2 [g=g', co=co'] + s_part^2 [p=p', both co]
        + s_pfam^2 [fam p = fam p', both co] + h(a) . h(b)."""
        s2 = self.s2
        same_gpu = (a.gpu[:, None] == b.gpu[None, :]).astype(F32)
        same_mode = same_gpu * (a.co[:, None] == b.co[None, :]).astype(F32)
        both_co = a.co[:, None] * b.co[None, :]
        same_partner = both_co * (a.partner[:, None] == b.partner[None, :]).astype(F32)
        same_pfam = both_co * (a.pfam[:, None] == b.pfam[None, :]).astype(F32)
        k = s2[0] + s2[1] * same_gpu + s2[2] * same_mode + s2[3] * same_partner + s2[4] * same_pfam
        if self.deep_dim:
            k = k + self._deep(a.x) @ self._deep(b.x).T
        return k

    def _noise(self, c: _CellArrays) -> np.ndarray:
        """Measurement noise variance: s_noise_co^2 co + s_noise_iso^2 (1 - co) + 1e-5."""
        return self.s2[5] * c.co + self.s2[6] * (F32(1.0) - c.co) + F32(1e-5)

    def predict(self, observed: pd.DataFrame, new: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the residual at the cells `new` of one job given its `observed` cells
        (column residual; may be empty): mean = m_n + K_no (K_oo + N)^-1 (r_o - m_o),
        var = diag K_nn - diag(K_no (K_oo + N)^-1 K_on), clamped at 1e-8. The kernels are float32 as in torch, the
        solve float64: a float32 Cholesky is only good to about cond(K_oo) x 6e-8 (1e-4 relative with tens of
        observations) and differs by that much between LAPACK builds, torch's included."""
        cells = _CellArrays(pd.concat([observed, new], ignore_index=True))
        n_obs = len(observed)
        obs, target = cells.take(slice(0, n_obs)), cells.take(slice(n_obs, None))
        m_new = self._m(target)
        prior_var = np.diagonal(self._kernel(target, target))
        if n_obs == 0:
            return m_new.astype(float), prior_var.astype(float)
        r_obs = observed["residual"].to_numpy(dtype=float).astype(F32)
        k_oo = (self._kernel(obs, obs) + np.diag(self._noise(obs))).astype(float)
        chol = linalg.cholesky(k_oo, lower=True)
        k_no = self._kernel(target, obs).astype(float)
        alpha = linalg.cho_solve((chol, True), (r_obs - self._m(obs)).astype(float)[:, None])
        mean = m_new + (k_no @ alpha)[:, 0]
        v = linalg.cho_solve((chol, True), k_no.T)
        var = np.maximum(prior_var - (k_no * v.T).sum(-1), F32(1e-8))
        return mean.astype(float), var.astype(float)


# ------------------------------------------------------------------------------------------------ the predictor


def saved_feedback(directory: Path) -> tuple[pd.DataFrame | None, dict]:
    """(feedback observed before saving or None, metadata) of a saved predictor: feedback.csv, predictor.json."""
    path = directory / "feedback.csv"
    feedback = pd.read_csv(path) if path.exists() else None
    if feedback is not None:
        feedback["partner_job_type"] = (
            feedback["partner_job_type"].astype(object).where(feedback["partner_job_type"].notna(), None)
        )
    meta = _read_json(directory / "predictor.json") if (directory / "predictor.json").exists() else {}
    return (feedback if feedback is not None and len(feedback) else None), meta


class PredictorRuntime:
    """Network 1 + network 2 + the feedback observed so far: the predictions the planner reads. With the numpy
    networks (`load`) it needs no torch; `PerformancePredictor` is the same with the torch networks."""

    def __init__(self, prior, refiner=None, feedback: pd.DataFrame | None = None, metadata: dict | None = None):
        self.prior = prior
        self.refiner = refiner
        self.feedback = feedback if feedback is not None else pd.DataFrame(columns=FEEDBACK_COLUMNS)
        self.metadata = metadata or {}

    @classmethod
    def load(cls, directory: Path | str) -> PredictorRuntime:
        """The numpy runtime of a predictor saved by `PerformancePredictor.save`; WeightsError naming the file
        when a weights or config file is unreadable or does not match the networks."""
        directory = Path(directory)
        prior = PriorRuntime.load(directory)
        refiner = RefinerRuntime.load(directory) if (directory / "refiner.pt").exists() else None
        return cls(prior, refiner, *saved_feedback(directory))

    # -- feedback ----------------------------------------------------------------------------------------------
    def copy(self):
        """A predictor that shares the trained networks (only read when predicting) and has its own feedback and
        metadata: `observe` on the copy leaves this one, e.g. a cached registered version, as it is."""
        return type(self)(self.prior, self.refiner, self.feedback.copy(), deepcopy(self.metadata))

    def observe(self, feedback) -> int:
        """Add runtime measurements: rows with job_type (+ job features), gpu_type, partner_job_type (None for
        isolated), steps_per_s of the job. Returns the number of stored observations. Network 1 is untouched;
        later predictions of the same job condition on everything observed."""
        frame = as_jobs(feedback)
        if "partner_job_type" not in frame:
            frame["partner_job_type"] = None
        frame["partner_job_type"] = (
            frame["partner_job_type"].astype(object).where(frame["partner_job_type"].notna(), None)
        )
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        bad = ~(pd.to_numeric(frame["steps_per_s"], errors="coerce") > 0)
        if bad.any():
            raise ValueError(f"feedback row {int(np.flatnonzero(bad)[0])}: steps_per_s must be > 0")
        frame = frame[FEEDBACK_COLUMNS]
        self.feedback = pd.concat([self.feedback, frame], ignore_index=True) if len(self.feedback) else frame
        return int(len(self.feedback))

    def _refine(self, cells: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(log mean, log variance) of cells (job_key, job_type, gpu_type, partner_job_type + job features)."""
        cells = attach_prior(cells, self.prior)
        mean = cells["prior_log"].to_numpy(dtype=float).copy()
        var = np.zeros(len(cells))
        if self.refiner is None:
            return mean, var
        observed = self.feedback
        for key, idx in cells.groupby("job_key", sort=False).groups.items():
            obs = observed[observed.job_key == key]
            target = cells.loc[idx]
            if len(obs):
                obs = attach_prior(obs.reset_index(drop=True), self.prior)
            else:
                obs = target.iloc[:0].assign(residual=[])
            m, v = self.refiner.predict(obs, target)
            positions = cells.index.get_indexer(idx)
            mean[positions] += m
            var[positions] = v
        return mean, var

    # -- predictions -------------------------------------------------------------------------------------------
    def isolated(self, jobs, gpu_type, refined: bool = True) -> np.ndarray:
        """Isolated steps/s of each job on `gpu_type` (a string, or one per job)."""
        frame = as_jobs(jobs)
        frame["gpu_type"] = [gpu_type] * len(frame) if isinstance(gpu_type, str) else list(gpu_type)
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        frame["partner_job_type"] = None
        if not refined:
            return self.prior.predict_isolated(frame, frame.gpu_type.tolist())
        mean, _ = self._refine(frame)
        return np.exp(mean)

    def colocated(self, job_a, job_b, gpu_type, refined: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Normalized throughput (fraction of isolated) of A next to B and of B next to A on `gpu_type`."""
        a, b = as_jobs(job_a), as_jobs(job_b)
        gpus = [gpu_type] * len(a) if isinstance(gpu_type, str) else list(gpu_type)
        norm_a = self.prior.predict_norm(a, b, gpus)
        norm_b = self.prior.predict_norm(b, a, gpus)
        if refined and self.refiner is not None and len(self.feedback):
            norm_a = self._refined_norm(a, b, gpus, norm_a)
            norm_b = self._refined_norm(b, a, gpus, norm_b)
        return norm_a, norm_b

    def _refined_norm(self, a, b, gpus, prior_norm) -> np.ndarray:
        """Refined co-located / refined isolated (both conditioned on the job's feedback)."""
        iso = a.copy()
        iso["gpu_type"] = [g.lower() for g in gpus]
        iso["partner_job_type"] = None
        co = iso.copy()
        co["partner_job_type"] = b.job_type.to_numpy()
        mean_iso, _ = self._refine(iso)
        mean_co, _ = self._refine(co)
        return np.minimum(np.exp(mean_co - mean_iso), 1.0)

    def predict_cells(self, cells) -> pd.DataFrame:
        """For placement cells (job features, gpu_type, partner_job_type): prior and refined steps/s of the job,
        and the refined log-space standard deviation (0 without a refiner)."""
        frame = as_jobs(cells)
        if "partner_job_type" not in frame:
            frame["partner_job_type"] = None
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        mean, var = self._refine(frame)
        prior = attach_prior(frame, self.prior)["prior_log"].to_numpy()
        return frame.assign(prior_steps_per_s=np.exp(prior), steps_per_s=np.exp(mean), log_std=np.sqrt(var))
