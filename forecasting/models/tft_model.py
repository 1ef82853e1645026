"""One global Temporal Fusion Transformer (pytorch-forecasting) across regions.

* group id = region (also a static categorical, so the network knows which grid it is looking at);
* known future inputs: calendar (UTC hour, weekday, day of year as sin/cos, weekend flag) and the GFS weather
  forecasts (NaN where a region has none → the training mean, plus the region embedding tells them apart);
* observed inputs (encoder only): the target itself over the last `max_encoder_length` hours, optionally further
  observed columns (`observed_columns`, e.g. renewable_share) and a lag of the target that is known for the whole
  horizon (`target_lags`, e.g. 168 h: pytorch-forecasting treats lags ≥ the prediction length as known);
* QuantileLoss([0.1, 0.5, 0.9]); every sample is weighted by 1 / (its region's mean target) so that the loss,
  computed in real units, does not let the dirtiest grid dominate (a relative error, which is what MAPE measures);
* target normalization per series: `normalizer="encoder"` (default) scales each sample by its own encoder window's
  mean/std (EncoderNormalizer; the scale of the region at that time, which follows level shifts such as DE's 2021
  move to coal), `normalizer="group"` by the region's training mean/std (GroupNormalizer by region).

Training is seeded and single-threaded, runs for `max_epochs` × `limit_train_batches` or until `max_time_s`, and
keeps the weights of the epoch with the lowest validation loss (the last `val_days` of the history) when there is
a validation window. `predict` rebuilds one encoder/decoder window per region from what `known_at` leaves at
`issued_at`, so the same model serves any issue time.

`TFTSettings.tiny()` is for tests (seconds), `TFTSettings.full()` for real training under a time budget.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from forecasting.base import OUTPUT_COLUMNS, Forecaster, known_at, target_column
from forecasting.data import WEATHER_COLUMNS, issue_hour

CALENDAR_FEATURES = ("hour_sin", "hour_cos", "dow_sin", "dow_cos", "doy_sin", "doy_cos", "weekend")
_EPOCH = pd.Timestamp("2000-01-01", tz="UTC")
_NONNEGATIVE_TARGETS = {"carbon_intensity", "solar", "wind"}


@dataclass
class TFTSettings:
    """Hyper-parameters and training limits. Defaults are the tiny test configuration."""

    max_encoder_length: int = 168
    max_prediction_length: int = 96
    hidden_size: int = 8
    attention_head_size: int = 1
    hidden_continuous_size: int = 4
    lstm_layers: int = 1
    dropout: float = 0.1
    learning_rate: float = 0.01
    batch_size: int = 32
    max_epochs: int = 3
    limit_train_batches: int = 10
    limit_val_batches: int = 5
    max_time_s: float | None = None
    gradient_clip_val: float = 0.1
    val_days: int = 0
    history_days: int | None = 120
    normalizer: str = "encoder"  # encoder: per-sample EncoderNormalizer; group: per-region GroupNormalizer
    use_weather: bool = True
    observed_columns: tuple[str, ...] = ()
    target_lags: tuple[int, ...] = ()
    seed: int = 0
    num_threads: int = 1

    @classmethod
    def tiny(cls, **overrides) -> TFTSettings:
        return replace(cls(), **overrides)

    @classmethod
    def full(cls, **overrides) -> TFTSettings:
        """Real training: 8 × 50 batches of 64, capped by `max_time_s` of wall clock (and by the service's budget
        share), best epoch on the last 21 days."""
        base = cls(
            hidden_size=32,
            attention_head_size=2,
            hidden_continuous_size=16,
            dropout=0.1,
            learning_rate=0.01,
            batch_size=64,
            max_epochs=8,
            limit_train_batches=50,
            limit_val_batches=10,
            max_time_s=480.0,
            val_days=21,
            history_days=730,
            target_lags=(168,),
        )
        return replace(base, **overrides)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["observed_columns"] = list(self.observed_columns)
        d["target_lags"] = list(self.target_lags)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TFTSettings:
        d = dict(d)
        d["observed_columns"] = tuple(d.get("observed_columns", ()))
        d["target_lags"] = tuple(d.get("target_lags", ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _quiet():
    """Silence Lightning's banners and the known noisy warnings (the sklearn feature-name one above all)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "pytorch_forecasting"):
        logging.getLogger(name).setLevel(logging.ERROR)
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message=".*does not have valid feature names.*")
    warnings.filterwarnings("ignore", message=".*num_workers.*")
    warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
    warnings.filterwarnings("ignore", message=".*Attribute 'loss' is an instance.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="lightning")
    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_forecasting")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*ReduceLROnPlateau conditioned on metric.*")
    return stack


class _EpochLosses:
    """Lightning callback (built lazily): mean train loss per epoch, validation loss, best weights."""

    def __new__(cls, *args, **kwargs):
        from lightning.pytorch.callbacks import Callback  # noqa: PLC0415 - torch stack, loaded only when a TFT trains

        class EpochLosses(Callback):
            def __init__(self):
                self.train_losses: list[float] = []
                self.val_losses: list[float] = []
                self._batch: list[float] = []
                self.best_state: dict | None = None
                self.best_val = math.inf
                self.best_epoch = -1
                self.batches = 0

            def on_train_epoch_start(self, trainer, pl_module):
                self._batch = []

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                self._batch.append(float(loss.detach()))
                self.batches += 1

            def on_train_epoch_end(self, trainer, pl_module):
                if self._batch:
                    self.train_losses.append(float(np.mean(self._batch)))

            def on_validation_epoch_end(self, trainer, pl_module):
                if trainer.sanity_checking:
                    return
                value = trainer.callback_metrics.get("val_loss")
                if value is None:
                    return
                value = float(value)
                self.val_losses.append(value)
                if value < self.best_val:
                    self.best_val = value
                    self.best_epoch = trainer.current_epoch
                    self.best_state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

        return EpochLosses()


class TFTForecaster(Forecaster):
    name = "tft"

    def __init__(self, settings: TFTSettings | None = None, **overrides):
        self.settings = replace(settings or TFTSettings(), **overrides)
        self.target: str | None = None
        self.regions_: list[str] = []
        self.train_losses_: list[float] = []
        self.val_losses_: list[float] = []
        self.best_epoch_: int = -1
        self.fit_seconds_: float = 0.0
        self.fit_cpu_seconds_: float = 0.0
        self.epochs_run_: int = 0
        self.batches_run_: int = 0
        self._net = None
        self._dataset_params: dict | None = None
        self._fill: dict[str, float] = {}
        self._scale: dict[str, float] = {}
        self._weather: list[str] = []

    # ------------------------------------------------------------ features
    def _frame(self, data: pd.DataFrame, column: str) -> pd.DataFrame:
        """Model frame: region, time_idx, target, weights, known and observed reals (NaNs filled)."""
        s = self.settings
        hours = data["hour_utc"]
        out = pd.DataFrame(
            {
                "region": data["region"].astype(str).to_numpy(),
                "time_idx": ((hours - _EPOCH) // pd.Timedelta(hours=1)).astype("int64").to_numpy(),
                "target": pd.to_numeric(data[column], errors="coerce").astype(float).to_numpy(),
            }
        )
        h = hours.dt.hour.to_numpy()
        dow = hours.dt.dayofweek.to_numpy()
        doy = hours.dt.dayofyear.to_numpy()
        out["hour_sin"] = np.sin(2 * np.pi * h / 24)
        out["hour_cos"] = np.cos(2 * np.pi * h / 24)
        out["dow_sin"] = np.sin(2 * np.pi * dow / 7)
        out["dow_cos"] = np.cos(2 * np.pi * dow / 7)
        out["doy_sin"] = np.sin(2 * np.pi * doy / 365.25)
        out["doy_cos"] = np.cos(2 * np.pi * doy / 365.25)
        out["weekend"] = (dow >= 5).astype(float)
        for c in self._weather:
            if c in data.columns:
                values = pd.to_numeric(data[c], errors="coerce").astype(float).to_numpy()
                out[c] = np.where(np.isfinite(values), values, self._fill[c])
            else:
                out[c] = self._fill[c]
        for c in s.observed_columns:
            out[c] = pd.to_numeric(data[c], errors="coerce").astype(float).to_numpy()
        return out

    def _fill_observed(self, frame: pd.DataFrame) -> pd.DataFrame:
        cols = ["target", *self.settings.observed_columns]
        frame[cols] = frame.groupby("region", sort=False)[cols].transform(lambda x: x.ffill().bfill())
        for c in cols:
            frame[c] = frame[c].fillna(0.0)
        return frame

    def _normalizer(self):
        from pytorch_forecasting.data import EncoderNormalizer, GroupNormalizer  # noqa: PLC0415 - torch stack, loaded only when a TFT trains

        if self.settings.normalizer == "group":
            return GroupNormalizer(groups=["region"])
        if self.settings.normalizer == "encoder":
            return EncoderNormalizer()
        raise ValueError(f"tft: unknown normalizer {self.settings.normalizer!r} (group | encoder)")

    # ----------------------------------------------------------------- fit
    def fit(self, history: pd.DataFrame, target: str, budget_s: float | None = None) -> TFTForecaster:
        import lightning.pytorch as pl  # noqa: PLC0415 - torch stack, loaded only when a TFT trains
        import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it
        from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet  # noqa: PLC0415 - torch stack, loaded only when a TFT trains
        from pytorch_forecasting.metrics import QuantileLoss  # noqa: PLC0415 - torch stack, loaded only when a TFT trains

        s = self.settings
        started = time.monotonic()
        cpu_started = time.process_time()
        torch.set_num_threads(s.num_threads)
        column = target_column(target, strict=True)
        self.target = target
        with _quiet():
            pl.seed_everything(s.seed, workers=True, verbose=False)
            hist = history[history[column].notna()]
            if s.history_days:
                hist = hist[hist["hour_utc"] > hist["hour_utc"].max() - pd.Timedelta(days=s.history_days)]
            need = s.max_encoder_length + s.max_prediction_length + max(s.target_lags, default=0)
            counts = hist.groupby("region").size()
            regions = sorted(counts[counts >= need + 24].index)
            if not regions:
                raise ValueError(f"tft: no region has {need + 24} hours of {column}")
            hist = hist[hist["region"].isin(regions)].sort_values(["region", "hour_utc"])
            self.regions_ = regions
            self._weather = []
            if s.use_weather:
                self._weather = [c for c in WEATHER_COLUMNS if c in hist and hist[c].notna().any()]
            self._fill = {c: float(hist[c].mean()) for c in self._weather}
            self._scale = {r: float(max(abs(g.mean()), 1e-6)) for r, g in hist.groupby("region")[column]}
            frame = self._fill_observed(self._frame(hist, column))
            # Hours missing in a series are allowed (filled forward by the dataset).
            frame["weight"] = frame["region"].map(lambda r: 1.0 / self._scale[r]).astype(float)
            mean_scale = float(np.mean(list(self._scale.values())))
            frame["weight"] = frame["weight"] * mean_scale
            known = list(CALENDAR_FEATURES) + list(self._weather)
            unknown = ["target", *s.observed_columns]
            val_start = None
            if s.val_days:
                val_start = int(frame["time_idx"].max()) - s.val_days * 24 + 1
            train_frame = frame if val_start is None else frame[frame["time_idx"] < val_start]
            dataset = TimeSeriesDataSet(
                train_frame,
                time_idx="time_idx",
                target="target",
                group_ids=["region"],
                weight="weight",
                max_encoder_length=s.max_encoder_length,
                min_encoder_length=s.max_encoder_length // 2,
                max_prediction_length=s.max_prediction_length,
                min_prediction_length=1,
                static_categoricals=["region"],
                time_varying_known_reals=known,
                time_varying_unknown_reals=unknown,
                lags={"target": list(s.target_lags)} if s.target_lags else None,
                target_normalizer=self._normalizer(),
                add_relative_time_idx=True,
                add_target_scales=True,
                add_encoder_length=True,
                allow_missing_timesteps=True,
            )
            loaders = {"train_dataloaders": dataset.to_dataloader(train=True, batch_size=s.batch_size, num_workers=0)}
            if val_start is not None:
                val = TimeSeriesDataSet.from_dataset(
                    dataset, frame, min_prediction_idx=val_start, stop_randomization=True
                )
                loaders["val_dataloaders"] = val.to_dataloader(train=False, batch_size=s.batch_size * 2, num_workers=0)
            net = TemporalFusionTransformer.from_dataset(
                dataset,
                hidden_size=s.hidden_size,
                attention_head_size=s.attention_head_size,
                hidden_continuous_size=s.hidden_continuous_size,
                lstm_layers=s.lstm_layers,
                dropout=s.dropout,
                learning_rate=s.learning_rate,
                loss=QuantileLoss(quantiles=[0.1, 0.5, 0.9]),
                log_interval=-1,
                reduce_on_plateau_patience=3 if val_start is not None else 1000,
            )
            tracker = _EpochLosses()
            limit = [x for x in (s.max_time_s, budget_s) if x]
            remaining = min(limit) - (time.monotonic() - started) if limit else None
            trainer_kwargs = dict(
                max_epochs=s.max_epochs,
                limit_train_batches=s.limit_train_batches,
                limit_val_batches=s.limit_val_batches,
                gradient_clip_val=s.gradient_clip_val,
                accelerator="cpu",
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                callbacks=[tracker],
                deterministic=True,
            )
            if remaining is not None:
                trainer_kwargs["max_time"] = timedelta(seconds=max(remaining, 1.0))
            trainer = pl.Trainer(**trainer_kwargs)
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.fit(net, **loaders)
            if tracker.best_state is not None:
                net.load_state_dict(tracker.best_state)
            net.eval()
        self._net = net
        self._dataset_params = dataset.get_parameters()
        self.train_losses_ = list(tracker.train_losses)
        self.val_losses_ = list(tracker.val_losses)
        self.best_epoch_ = tracker.best_epoch
        self.epochs_run_ = len(tracker.train_losses)
        self.fit_seconds_ = time.monotonic() - started
        self.fit_cpu_seconds_ = time.process_time() - cpu_started
        self.batches_run_ = tracker.batches
        return self

    # ------------------------------------------------------------- predict
    def predict(self, issued_at: pd.Timestamp, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it
        from pytorch_forecasting import TimeSeriesDataSet  # noqa: PLC0415 - torch stack, loaded only when a TFT trains

        if self._net is None:
            raise RuntimeError("TFTForecaster.predict called before fit")
        s = self.settings
        if not 1 <= horizon <= s.max_prediction_length:
            raise ValueError(f"tft: horizon must be 1..{s.max_prediction_length}, got {horizon}")
        torch.set_num_threads(s.num_threads)
        issued = issue_hour(issued_at)
        column = target_column(self.target, strict=True)
        lag = max(s.target_lags, default=0)
        enc = s.max_encoder_length + lag
        start = issued - pd.Timedelta(hours=enc)
        hours = pd.date_range(start, periods=enc + s.max_prediction_length, freq="h")
        window = data[(data["hour_utc"] >= hours[0]) & (data["hour_utc"] <= hours[-1])]
        seen = known_at(window, issued)
        parts = []
        for region in self.regions_:
            rows = seen[seen["region"] == region]
            past = rows[rows["hour_utc"] < issued][column]
            if pd.to_numeric(past, errors="coerce").notna().sum() < max(24, s.max_encoder_length // 4):
                continue
            rows = rows.drop_duplicates("hour_utc").set_index("hour_utc").reindex(hours)
            rows.index.name = "hour_utc"
            rows = rows.reset_index()
            rows["region"] = region
            parts.append(rows)
        if not parts:
            return pd.DataFrame(columns=list(OUTPUT_COLUMNS))
        full = pd.concat(parts, ignore_index=True)
        frame = self._fill_observed(self._frame(full, column))
        frame["weight"] = 1.0
        with _quiet():
            dataset = TimeSeriesDataSet.from_parameters(
                self._dataset_params, frame, predict=True, stop_randomization=True
            )
            loader = dataset.to_dataloader(train=False, batch_size=max(len(parts), 1), num_workers=0)
            outputs = []
            with torch.no_grad():
                for x, _ in loader:
                    out = self._net(x)
                    index = dataset.x_to_index(x)
                    outputs.append((index, out["prediction"].cpu().numpy()))
        frames = []
        first_idx = int((issued - _EPOCH) // pd.Timedelta(hours=1))
        for index, pred in outputs:
            for i, (region, t0) in enumerate(zip(index["region"], index["time_idx"])):
                if int(t0) != first_idx:
                    raise RuntimeError(f"tft: decoder starts at {t0}, expected {first_idx} for {region}")
                q = np.sort(pred[i, :horizon, :], axis=1)
                if self.target in _NONNEGATIVE_TARGETS:
                    q = np.clip(q, 0.0, None)
                frames.append(
                    pd.DataFrame(
                        {
                            "region": str(region),
                            "issued_at": issued,
                            "target_time": pd.date_range(issued, periods=horizon, freq="h"),
                            "horizon_h": np.arange(1, horizon + 1),
                            "p10": q[:, 0].astype(float),
                            "p50": q[:, 1].astype(float),
                            "p90": q[:, 2].astype(float),
                            "model": self.name,
                        }
                    )
                )
        return pd.concat(frames, ignore_index=True).sort_values(["region", "target_time"]).reset_index(drop=True)

    # --------------------------------------------------------- persistence
    def save(self, directory: Path | str) -> Path:
        import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it

        if self._net is None:
            raise RuntimeError("nothing to save: fit first")
        path = Path(directory) / "tft.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "format": "tft-v1",
                "settings": self.settings.to_dict(),
                "target": self.target,
                "regions": self.regions_,
                "fill": self._fill,
                "scale": self._scale,
                "weather": self._weather,
                "dataset_params": self._dataset_params,
                "hparams": dict(self._net.hparams),
                "state_dict": self._net.state_dict(),
                "train_losses": self.train_losses_,
                "val_losses": self.val_losses_,
                "best_epoch": self.best_epoch_,
                "fit_seconds": self.fit_seconds_,
                "fit_cpu_seconds": self.fit_cpu_seconds_,
                "batches_run": self.batches_run_,
                "epochs_run": self.epochs_run_,
            },
            path,
        )
        return path

    @classmethod
    def load(cls, directory: Path | str) -> TFTForecaster:
        import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it
        from pytorch_forecasting import TemporalFusionTransformer  # noqa: PLC0415 - torch stack, loaded only when a TFT trains

        path = Path(directory) / "tft.pt"
        with _quiet():
            blob = torch.load(path, map_location="cpu", weights_only=False)
            if not isinstance(blob, dict) or blob.get("format") != "tft-v1":
                raise ValueError(f"{path} is not a TFT artifact")
            model = cls(TFTSettings.from_dict(blob["settings"]))
            net = TemporalFusionTransformer(**blob["hparams"])
            net.load_state_dict(blob["state_dict"])
            net.eval()
        model._net = net
        model.target = blob["target"]
        model.regions_ = list(blob["regions"])
        model._fill = dict(blob["fill"])
        model._scale = dict(blob["scale"])
        model._weather = list(blob["weather"])
        model._dataset_params = blob["dataset_params"]
        model.train_losses_ = list(blob["train_losses"])
        model.val_losses_ = list(blob["val_losses"])
        model.best_epoch_ = int(blob["best_epoch"])
        model.fit_seconds_ = float(blob["fit_seconds"])
        model.fit_cpu_seconds_ = float(blob.get("fit_cpu_seconds", 0.0))
        model.batches_run_ = int(blob.get("batches_run", 0))
        model.epochs_run_ = int(blob.get("epochs_run", len(model.train_losses_)))
        return model

    def get_params(self) -> dict:
        return {
            "settings": self.settings.to_dict(),
            "regions": list(self.regions_),
            "weather": list(self._weather),
            "epochs_run": self.epochs_run_,
            "best_epoch": self.best_epoch_,
            "train_losses": [round(x, 6) for x in self.train_losses_],
            "val_losses": [round(x, 6) for x in self.val_losses_],
            "batches_run": self.batches_run_,
            "fit_seconds": round(self.fit_seconds_, 2),
            "fit_cpu_seconds": round(self.fit_cpu_seconds_, 2),
        }
