"""Network 1 (the prior): isolated throughput of a job on a GPU type, and the interference of a co-located pair.

Representation. A job is encoded as z = f(features) + e_type[job_type] + e_key[job key]: the feature MLP
generalises to unseen jobs (family, batch size, scale factor, resource shape), the two free embeddings carry
what the training data says about this particular job type (shared by its scale factors) and this job. For a job
whose throughput on a GPU type was never measured, the embeddings are still learnt from its measurements on the
other GPU types and from its co-locations, so "unseen hardware" is predicted from the job's own fingerprint and
from how other jobs behave on that hardware. Unknown jobs get zero embeddings (feature part only).

Heads (each a small MLP), all in log space:
  isolated:   log steps/s (job, gpu) = g([z, u_gpu, z*u_gpu])            (trained in standardized units)
  co-located: log normalized throughput of A next to B on gpu = -softplus(h([z_A, z_A+z_B, z_A*z_B,
              |z_A-z_B|, u_gpu, z_A*u_gpu]))  — symmetric pair features plus the job's own code, so the two
              directions of a pair share the pair part; -softplus keeps the fraction in (0, 1].
Loss: mean squared log error of both heads (log errors are relative errors), plus L2 on the free embeddings.
An ensemble of a few seeds is averaged in log space. Deterministic for a given seed (single-threaded).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from scheduling.models.performance.features import (
    N_JOB_FEATURES,
    N_TYPE_FEATURES,
    PerfTables,
    Vocab,
    job_features,
    normalise_jobs,
)


@dataclass
class PriorConfig:
    dim: int = 16
    hidden: int = 64
    epochs: int = 700
    lr: float = 5e-3
    weight_decay: float = 1e-5
    type_l2: float = 0.1  # free job-type embedding of the isolated heads
    pair_type_l2: float = 1e-3  # free job-type embedding of the co-location head
    key_l2: float = 1e-2  # free per-job embedding of the co-location head
    pair_weight: float = 1.0
    n_models: int = 3
    seed: int = 0
    job_bias: bool = True
    bias_l2: float = 1e-4


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_out)
    )


class PriorNet(nn.Module):
    """Job type code z_t = f(type features) + e_type; job code z = z_t + e'_type + W shape + e_key (the
    co-location head adds its own, more loosely regularised, free embeddings to the shared type code).

    log iso(job, gpu) = A(z_t, gpu) + b_type + [scale > 1] S(z_t, shape, gpu) + b_key: the type's 1-GPU level on
    that GPU plus the multi-GPU speed-up of this resource shape on that GPU, so what is learnt about a job type on
    a GPU transfers to its other scale factors and vice versa.
    """

    def __init__(self, n_types: int, n_keys: int, n_gpus: int, dim: int, hidden: int, job_bias: bool = True):
        super().__init__()
        self.use_bias = job_bias
        self.type_feat = _mlp(N_TYPE_FEATURES, hidden, dim)
        self.shape_proj = nn.Linear(N_JOB_FEATURES - N_TYPE_FEATURES, dim, bias=False)
        self.type_emb = nn.Embedding(n_types + 1, dim, padding_idx=n_types)
        self.pair_type_emb = nn.Embedding(n_types + 1, dim, padding_idx=n_types)
        self.key_emb = nn.Embedding(n_keys + 1, dim, padding_idx=n_keys)
        self.type_bias = nn.Embedding(n_types + 1, 1, padding_idx=n_types)
        self.key_bias = nn.Embedding(n_keys + 1, 1, padding_idx=n_keys)
        for emb in (self.type_emb, self.pair_type_emb, self.key_emb, self.type_bias, self.key_bias):
            nn.init.zeros_(emb.weight)
        self.gpu_emb = nn.Embedding(n_gpus, dim)
        self.level_head = _mlp(3 * dim, hidden, 1)
        self.scale_head = _mlp(3 * dim + N_JOB_FEATURES - N_TYPE_FEATURES, hidden, 1)
        self.pair_head = _mlp(6 * dim, hidden, 1)

    def encode(self, x, t, k):
        """(type code, job code, shape features, bias, multi-GPU flag) of jobs."""
        shape = x[:, N_TYPE_FEATURES:]
        f = self.type_feat(x[:, :N_TYPE_FEATURES])
        zt = f + self.type_emb(t)
        z = zt + self.pair_type_emb(t) + self.shape_proj(shape) + self.key_emb(k)
        bias = (self.type_bias(t) + self.key_bias(k)).squeeze(-1)
        if not self.use_bias:
            bias = torch.zeros_like(bias)
        multi = (x[:, N_TYPE_FEATURES] > 0).float()  # log2 scale > 0
        return zt, z, shape, bias, multi

    @staticmethod
    def take(code, idx):
        return tuple(c[idx] for c in code)

    def iso_code(self, code, g):
        zt, _z, shape, bias, multi = code
        u = self.gpu_emb(g)
        level = self.level_head(torch.cat([zt, u, zt * u], dim=-1)).squeeze(-1)
        speedup = self.scale_head(torch.cat([zt, shape, u, zt * u], dim=-1)).squeeze(-1)
        return level + multi * speedup + bias

    def log_norm_code(self, code_a, code_b, g):
        za, zb = code_a[1], code_b[1]
        u = self.gpu_emb(g)
        h = self.pair_head(torch.cat([za, za + zb, za * zb, (za - zb).abs(), u, za * u], dim=-1)).squeeze(-1)
        return -nn.functional.softplus(h)

    def iso(self, x, t, k, g):
        return self.iso_code(self.encode(x, t, k), g)

    def log_norm(self, xa, ta, ka, xb, tb, kb, g):
        return self.log_norm_code(self.encode(xa, ta, ka), self.encode(xb, tb, kb), g)


class PriorModel:
    """Network 1: fit on simulation tables; predict isolated steps/s and normalized co-located throughput."""

    def __init__(self, config: PriorConfig | None = None):
        self.config = config or PriorConfig()
        self.nets: list[PriorNet] = []
        self.vocab: Vocab | None = None
        self.iso_mean = 0.0
        self.iso_std = 1.0
        self.history: list[list[float]] = []

    # -- tensors ---------------------------------------------------------------------------------------------
    def _job_tensors(self, jobs: pd.DataFrame):
        frame = normalise_jobs(jobs)
        x = torch.from_numpy(job_features(frame))
        t = torch.from_numpy(self.vocab.type_index(frame.job_type))
        k = torch.from_numpy(self.vocab.key_index(frame.job_key))
        return x, t, k

    def _rows(self, tables: PerfTables, keys) -> pd.DataFrame:
        return tables.jobs.loc[list(keys)].reset_index()

    # -- training --------------------------------------------------------------------------------------------
    def fit(self, tables: PerfTables, log_every: int = 0) -> PriorModel:
        cfg = self.config
        torch.set_num_threads(1)
        self.vocab = Vocab(types=sorted(tables.jobs.job_type.unique()), keys=sorted(tables.jobs.index))
        iso, pairs = tables.iso, tables.pairs
        y_iso = torch.tensor(iso.log_y.to_numpy(), dtype=torch.float32)
        self.iso_mean = float(y_iso.mean())
        self.iso_std = float(y_iso.std()) if len(iso) > 1 else 1.0
        all_jobs = self._job_tensors(tables.jobs.loc[self.vocab.keys].reset_index())
        row = {k: i for i, k in enumerate(self.vocab.keys)}
        iso_idx = torch.tensor([row[k] for k in iso.job_key], dtype=torch.long)
        iso_gpu = torch.from_numpy(self.vocab.gpu_index(iso.gpu_type))
        y_pair = torch.tensor(pairs.log_norm.to_numpy(), dtype=torch.float32)
        a_idx = torch.tensor([row[k] for k in pairs.job_key], dtype=torch.long)
        b_idx = torch.tensor([row[k] for k in pairs.partner_key], dtype=torch.long)
        pair_gpu = torch.from_numpy(self.vocab.gpu_index(pairs.gpu_type))
        y_std = (y_iso - self.iso_mean) / self.iso_std
        self.nets, self.history = [], []
        for m in range(cfg.n_models):
            torch.manual_seed(cfg.seed * 1000 + m)
            net = PriorNet(
                len(self.vocab.types), len(self.vocab.keys), len(self.vocab.gpus), cfg.dim, cfg.hidden, cfg.job_bias
            )
            opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs, eta_min=cfg.lr * 0.02)
            losses = []
            for epoch in range(cfg.epochs):
                opt.zero_grad()
                code = net.encode(*all_jobs)
                loss = ((net.iso_code(net.take(code, iso_idx), iso_gpu) - y_std) * self.iso_std).pow(2).mean()
                if len(pairs):
                    pred = net.log_norm_code(net.take(code, a_idx), net.take(code, b_idx), pair_gpu)
                    loss_pair = (pred - y_pair).pow(2).mean()
                    loss = loss + cfg.pair_weight * loss_pair
                reg = (
                    cfg.type_l2 * net.type_emb.weight.pow(2).sum(1).mean()
                    + cfg.pair_type_l2 * net.pair_type_emb.weight.pow(2).sum(1).mean()
                    + cfg.key_l2 * net.key_emb.weight.pow(2).sum(1).mean()
                    + cfg.bias_l2 * (net.type_bias.weight.pow(2).mean() + net.key_bias.weight.pow(2).mean())
                )
                (loss + reg).backward()
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                if log_every and epoch % log_every == 0:
                    print(f"model {m} epoch {epoch} loss {float(loss):.4f}")
            net.eval()
            self.nets.append(net)
            self.history.append(losses)
        return self

    # -- prediction ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def predict_log_isolated(self, jobs: pd.DataFrame, gpu_types) -> np.ndarray:
        """Log steps/s of each job (rows of `jobs`) on the matching GPU type (same length, or one string)."""
        x, t, k = self._job_tensors(jobs)
        gpus = [gpu_types] * len(jobs) if isinstance(gpu_types, str) else list(gpu_types)
        g = torch.from_numpy(self.vocab.gpu_index(gpus))
        out = torch.stack([net.iso(x, t, k, g) for net in self.nets]).mean(0)
        return (out * self.iso_std + self.iso_mean).numpy().astype(float)

    def predict_isolated(self, jobs: pd.DataFrame, gpu_types) -> np.ndarray:
        return np.exp(self.predict_log_isolated(jobs, gpu_types))

    @torch.no_grad()
    def predict_log_norm(self, jobs_a: pd.DataFrame, jobs_b: pd.DataFrame, gpu_types) -> np.ndarray:
        """Log normalized throughput of job A (rows of jobs_a) co-located with B (rows of jobs_b)."""
        xa, ta, ka = self._job_tensors(jobs_a)
        xb, tb, kb = self._job_tensors(jobs_b)
        gpus = [gpu_types] * len(jobs_a) if isinstance(gpu_types, str) else list(gpu_types)
        g = torch.from_numpy(self.vocab.gpu_index(gpus))
        return torch.stack([net.log_norm(xa, ta, ka, xb, tb, kb, g) for net in self.nets]).mean(0).numpy().astype(float)

    def predict_norm(self, jobs_a, jobs_b, gpu_types) -> np.ndarray:
        return np.exp(self.predict_log_norm(jobs_a, jobs_b, gpu_types))

    # -- table helpers ---------------------------------------------------------------------------------------
    def predict_iso_table(self, tables: PerfTables, iso: pd.DataFrame) -> np.ndarray:
        """Predicted steps/s for rows (job_key, gpu_type) of an iso-shaped frame."""
        return self.predict_isolated(self._rows(tables, iso.job_key), iso.gpu_type.tolist())

    def predict_pair_table(self, tables: PerfTables, pairs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(normalized throughput, co-located steps/s) for rows (job_key, partner_key, gpu_type)."""
        a = self._rows(tables, pairs.job_key)
        b = self._rows(tables, pairs.partner_key)
        gpus = pairs.gpu_type.tolist()
        log_norm = self.predict_log_norm(a, b, gpus)
        log_iso = self.predict_log_isolated(a, gpus)
        return np.exp(log_norm), np.exp(log_norm + log_iso)

    # -- persistence -----------------------------------------------------------------------------------------
    def save(self, directory: Path | str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {
            "config": asdict(self.config),
            "vocab": {"types": self.vocab.types, "keys": self.vocab.keys, "gpus": self.vocab.gpus},
            "iso_mean": self.iso_mean,
            "iso_std": self.iso_std,
            "final_loss": [h[-1] for h in self.history] if self.history else None,
        }
        (directory / "prior.json").write_text(json.dumps(meta, indent=2))
        torch.save([net.state_dict() for net in self.nets], directory / "prior.pt")
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> PriorModel:
        directory = Path(directory)
        meta = json.loads((directory / "prior.json").read_text())
        model = cls(PriorConfig(**meta["config"]))
        model.vocab = Vocab(**meta["vocab"])
        model.iso_mean, model.iso_std = meta["iso_mean"], meta["iso_std"]
        states = torch.load(directory / "prior.pt", weights_only=True)
        cfg = model.config
        for state in states:
            net = PriorNet(
                len(model.vocab.types), len(model.vocab.keys), len(model.vocab.gpus), cfg.dim, cfg.hidden, cfg.job_bias
            )
            net.load_state_dict(state)
            net.eval()
            model.nets.append(net)
        return model

    def clone_config(self, **changes) -> PriorConfig:
        cfg = copy.deepcopy(self.config)
        for name, value in changes.items():
            setattr(cfg, name, value)
        return cfg
