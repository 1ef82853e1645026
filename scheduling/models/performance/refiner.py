"""Network 2 (the refiner): corrects network 1's estimates with observed runtime throughput.

Setting. For a job, a *cell* is a (GPU type, partner or none) placement; network 1 gives a prior log throughput
mu0(cell) for every cell. After deployment, some cells are observed (noisy runtime measurements). The refiner
models the residual r(cell) = log observed - mu0(cell) of one job as a Gaussian process over its cells,

    r ~ GP(m(cell), k(cell, cell')),

with a learnt mean m (how reality differs from the simulation prior on average, from other jobs' feedback) and a
learnt kernel that encodes how errors correlate across GPU types and partners:

    k = s_job^2                                  every cell of the job shares an offset (e.g. a unit mismatch)
      + s_gpu^2   [g = g']                        same GPU type
      + s_mode^2  [g = g', iso = iso']            same GPU and both isolated / both co-located
      + s_part^2  [p = p', both co-located]       same partner (on any GPU)
      + s_pfam^2  [fam(p) = fam(p'), both co]     partners of the same model family
      + h(c) . h(c')                              a small network h (deep kernel) on the cell and job features
      + noise^2   [c = c']                        measurement noise

Hyperparameters (the s's, the networks m and h, the noise) are trained by maximising the GP marginal likelihood
of the residual vectors of jobs with feedback (torch, Adam). Network 1 is never retrained: a new batch of
feedback only extends the set of observed cells, and the prediction for every unobserved cell is the posterior
mean  mu0 + m + K_uo (K_oo + noise^2 I)^-1 (r_o - m_o),  with posterior variance for free. The kernel can be
re-fitted from accumulated feedback (e.g. nightly) without touching network 1.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from scheduling.models.performance.features import GPU_TYPES, N_CELL_FEATURES, cell_features, parse_job_type


@dataclass
class RefinerConfig:
    deep_dim: int = 4
    hidden: int = 32
    mean_hidden: int = 0  # 0: linear mean function
    # Mean of the residual before any feedback of the job. "none" (default): zero, i.e. network 2 with no
    # observations returns network 1's estimate; a population mean learnt from other model families' feedback
    # ("gpu_mode": per GPU type x isolated/co-located, "cell": on all cell features) did not transfer across
    # families in protocol 3 (it raised the 0-observation error), so it is off.
    mean: str = "none"
    epochs: int = 300
    lr: float = 0.02
    weight_decay: float = 1e-4
    seed: int = 0


class _Cells:
    """Tensors of one job's cells."""

    def __init__(self, cells: pd.DataFrame):
        self.x = torch.from_numpy(cell_features(cells))
        self.gpu = torch.tensor([GPU_TYPES.index(g) for g in cells["gpu_type"]], dtype=torch.long)
        partner = cells["partner_job_type"].to_numpy(dtype=object)
        co = np.array([isinstance(p, str) and p != "" for p in partner])
        self.co = torch.from_numpy(co.astype(np.float32))
        names = [p if c else "" for p, c in zip(partner, co)]
        codes = {name: i for i, name in enumerate(sorted(set(names)))}
        self.partner = torch.tensor([codes[nm] for nm in names], dtype=torch.long)
        fams = [parse_job_type(p)[0] if c else "" for p, c in zip(partner, co)]
        fcodes = {name: i for i, name in enumerate(sorted(set(fams)))}
        self.pfam = torch.tensor([fcodes[f] for f in fams], dtype=torch.long)
        self.n = len(cells)

    def take(self, idx: torch.Tensor) -> _Cells:
        out = object.__new__(_Cells)
        out.x, out.gpu, out.co = self.x[idx], self.gpu[idx], self.co[idx]
        out.partner, out.pfam = self.partner[idx], self.pfam[idx]
        out.n = len(idx)
        return out


class RefinerNet(nn.Module):
    def __init__(self, config: RefinerConfig):
        super().__init__()
        if config.mean_hidden:
            self.mean = nn.Sequential(
                nn.Linear(N_CELL_FEATURES, config.mean_hidden), nn.SiLU(), nn.Linear(config.mean_hidden, 1)
            )
        else:
            self.mean = nn.Sequential(nn.Linear(N_CELL_FEATURES, 1))
        self.deep_dim = config.deep_dim
        self.mean_kind = config.mean
        mask = torch.zeros(N_CELL_FEATURES)
        mask[: len(GPU_TYPES) + 1] = 1.0
        self.register_buffer("gpu_mode_mask", mask)
        self.deep = nn.Sequential(
            nn.Linear(N_CELL_FEATURES, config.hidden), nn.SiLU(), nn.Linear(config.hidden, max(config.deep_dim, 1))
        )
        # log standard deviations: job, gpu, mode, partner, partner family, noise (co-located), noise (isolated)
        self.log_s = nn.Parameter(torch.tensor([-0.5, -1.5, -1.5, -2.0, -2.0, -2.0, -2.5]))
        nn.init.zeros_(self.mean[-1].weight)
        nn.init.zeros_(self.mean[-1].bias)
        with torch.no_grad():
            self.deep[-1].weight.mul_(0.1)

    def m(self, c: _Cells) -> torch.Tensor:
        if self.mean_kind == "none":
            return torch.zeros(c.n)
        x = c.x if self.mean_kind == "cell" else c.x * self.gpu_mode_mask
        return self.mean(x).squeeze(-1)

    def kernel(self, a: _Cells, b: _Cells) -> torch.Tensor:
        s2 = torch.exp(2 * self.log_s)
        same_gpu = (a.gpu[:, None] == b.gpu[None, :]).float()
        same_mode = same_gpu * (a.co[:, None] == b.co[None, :]).float()
        both_co = a.co[:, None] * b.co[None, :]
        same_partner = both_co * (a.partner[:, None] == b.partner[None, :]).float()
        same_pfam = both_co * (a.pfam[:, None] == b.pfam[None, :]).float()
        k = s2[0] + s2[1] * same_gpu + s2[2] * same_mode + s2[3] * same_partner + s2[4] * same_pfam
        if self.deep_dim:
            k = k + self.deep(a.x) @ self.deep(b.x).T
        return k

    def noise(self, c: _Cells) -> torch.Tensor:
        s2 = torch.exp(2 * self.log_s)
        return s2[5] * c.co + s2[6] * (1 - c.co) + 1e-5

    def neg_log_marginal(self, c: _Cells, r: torch.Tensor) -> torch.Tensor:
        k = self.kernel(c, c) + torch.diag(self.noise(c))
        chol = torch.linalg.cholesky(k)
        resid = (r - self.m(c)).unsqueeze(-1)
        alpha = torch.cholesky_solve(resid, chol)
        return 0.5 * (resid * alpha).sum() + torch.log(torch.diagonal(chol)).sum() + 0.5 * c.n * np.log(2 * np.pi)

    def posterior(self, obs: _Cells, r_obs: torch.Tensor, new: _Cells) -> tuple[torch.Tensor, torch.Tensor]:
        m_new = self.m(new)
        prior_var = torch.diagonal(self.kernel(new, new))
        if obs.n == 0:
            return m_new, prior_var
        k_oo = self.kernel(obs, obs) + torch.diag(self.noise(obs))
        chol = torch.linalg.cholesky(k_oo)
        k_no = self.kernel(new, obs)
        alpha = torch.cholesky_solve((r_obs - self.m(obs)).unsqueeze(-1), chol)
        mean = m_new + (k_no @ alpha).squeeze(-1)
        v = torch.cholesky_solve(k_no.T, chol)
        var = prior_var - (k_no * v.T).sum(-1)
        return mean, var.clamp_min(1e-8)


class Refiner:
    """Network 2. `fit` learns the kernel from jobs with feedback; `predict` conditions on observed cells."""

    def __init__(self, config: RefinerConfig | None = None):
        self.config = config or RefinerConfig()
        self.net: RefinerNet | None = None
        self.history: list[float] = []

    def fit(self, cells: pd.DataFrame) -> Refiner:
        """cells: job_key, job_type, gpu_type, partner_job_type, prior_log_norm, prior_log_iso, residual
        (log observed - prior log), one row per observed cell of the feedback jobs."""
        torch.set_num_threads(1)
        torch.manual_seed(self.config.seed)
        self.net = RefinerNet(self.config)
        groups = [
            (_Cells(g), torch.tensor(g["residual"].to_numpy(), dtype=torch.float32))
            for _, g in cells.groupby("job_key", sort=True)
        ]
        n_total = sum(c.n for c, _ in groups)
        opt = torch.optim.Adam(self.net.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.history = []
        for _ in range(self.config.epochs):
            opt.zero_grad()
            loss = sum(self.net.neg_log_marginal(c, r) for c, r in groups) / n_total
            loss.backward()
            opt.step()
            self.history.append(float(loss.detach()))
        self.net.eval()
        return self

    @torch.no_grad()
    def predict(self, observed: pd.DataFrame, new: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the residual at the cells `new` of one job, given its `observed` cells
        (with a `residual` column; may be empty)."""
        obs_cells = _Cells(pd.concat([observed, new], ignore_index=True))
        n_obs = len(observed)
        idx_obs = torch.arange(n_obs)
        idx_new = torch.arange(n_obs, n_obs + len(new))
        r_obs = torch.tensor(observed["residual"].to_numpy(dtype=float) if n_obs else np.zeros(0), dtype=torch.float32)
        mean, var = self.net.posterior(obs_cells.take(idx_obs), r_obs, obs_cells.take(idx_new))
        return mean.numpy().astype(float), var.numpy().astype(float)

    def kernel_summary(self) -> dict:
        names = ["job", "gpu", "mode", "partner", "partner_family", "noise_co", "noise_iso"]
        return {n: round(float(v), 4) for n, v in zip(names, torch.exp(self.net.log_s.detach()).tolist())}

    def save(self, directory: Path | str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), directory / "refiner.pt")
        (directory / "refiner.json").write_text(
            json.dumps({"config": asdict(self.config), "kernel": self.kernel_summary()}, indent=2)
        )
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> Refiner:
        directory = Path(directory)
        meta = json.loads((directory / "refiner.json").read_text())
        refiner = cls(RefinerConfig(**meta["config"]))
        refiner.net = RefinerNet(refiner.config)
        refiner.net.load_state_dict(torch.load(directory / "refiner.pt", weights_only=True))
        refiner.net.eval()
        return refiner
