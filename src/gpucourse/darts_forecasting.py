"""Lesson 9 (case study: forecasting with Darts): AirPassengers offline, the seed's RNNModel, quiet trainers.

Darts' ``AirPassengersDataset().load()`` downloads ``AirPassengers.csv`` from GitHub into its cache
(``DatasetLoader._DEFAULT_DIRECTORY``, ``~/.darts/datasets`` by default) as ``air_passengers.csv``,
then checks its md5. Without a network (CI, the grader, many labs), ``write_air_passengers`` writes
the same bytes there, so Darts' own loader, md5 check included, is used unchanged.
``python -m gpucourse.darts_ddp`` (lesson 9 too) trains the same model with ``ddp_spawn``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

# Box & Jenkins (1976), series G: international airline passengers (thousands), 1949-01 .. 1960-12.
AIR_PASSENGERS = (
    112, 118, 132, 129, 121, 135, 148, 148, 136, 119, 104, 118,
    115, 126, 141, 135, 125, 149, 170, 170, 158, 133, 114, 140,
    145, 150, 178, 163, 172, 178, 199, 199, 184, 162, 146, 166,
    171, 180, 193, 181, 183, 218, 230, 242, 209, 191, 172, 194,
    196, 196, 236, 235, 229, 243, 264, 272, 237, 211, 180, 201,
    204, 188, 235, 227, 234, 264, 302, 293, 259, 229, 203, 229,
    242, 233, 267, 269, 270, 315, 364, 347, 312, 274, 237, 278,
    284, 277, 317, 313, 318, 374, 413, 405, 355, 306, 271, 306,
    315, 301, 356, 348, 355, 422, 465, 467, 404, 347, 305, 336,
    340, 318, 362, 348, 363, 435, 491, 505, 404, 359, 310, 337,
    360, 342, 406, 396, 420, 472, 548, 559, 463, 407, 362, 405,
    417, 391, 419, 461, 472, 535, 622, 606, 508, 461, 390, 432,
)
AIR_PASSENGERS_FILE = "air_passengers.csv"  # the name Darts caches it under (AirPassengersDataset's metadata)
AIR_PASSENGERS_MD5 = "167ffa96204a2b47339c21eea25baf32"  # what Darts checks after every load

# The seed's model, as in Darts' GPU/TPU guide (2022); only n_epochs and pl_trainer_kwargs vary here.
SEED_RNN_KWARGS = dict(model="RNN", hidden_dim=20, dropout=0, batch_size=16, optimizer_kwargs={"lr": 1e-3},
                       model_name="Air_RNN", random_state=42, training_length=20, input_chunk_length=14,
                       force_reset=True)
SPLIT_AFTER = "1959-01-01"  # the seed's split: train up to January 1959, validate on the 23 months after


def air_passengers_csv() -> bytes:
    """The exact bytes of Darts' ``AirPassengers.csv``: ``Month,#Passengers``, then ``1949-01,112``... (LF)."""
    rows = [f"{1949 + i // 12}-{i % 12 + 1:02d},{value}" for i, value in enumerate(AIR_PASSENGERS)]
    return ("\n".join(["Month,#Passengers", *rows]) + "\n").encode("ascii")


def darts_air_passengers_path() -> Path:
    """Where Darts' loader looks for the file now (it follows an override of ``DatasetLoader._DEFAULT_DIRECTORY``)."""
    from darts.datasets import AirPassengersDataset

    return Path(AirPassengersDataset()._get_path_dataset())


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def write_air_passengers(directory: str | os.PathLike | None = None, data: bytes | None = None) -> Path:
    """Put AirPassengers where Darts looks (or in ``directory``) so that ``AirPassengersDataset().load()`` works offline.

    A file that is already there with the right md5 is left alone. A damaged one (a cut download)
    would make Darts fail forever (it only downloads missing files), so it is replaced, with a
    warning. ``data`` (default: ``air_passengers_csv()``) must have Darts' md5, else ValueError and
    nothing is written.
    """
    data = air_passengers_csv() if data is None else data
    if _md5(data) != AIR_PASSENGERS_MD5:
        raise ValueError(f"refusing to write AirPassengers: md5 {_md5(data)} is not the {AIR_PASSENGERS_MD5} "
                         "Darts checks, so its loader would reject the file")
    path = Path(directory) / AIR_PASSENGERS_FILE if directory is not None else darts_air_passengers_path()
    if path.is_file():
        if _md5(path.read_bytes()) == AIR_PASSENGERS_MD5:
            return path
        warnings.warn(f"{path} has the wrong md5 (a damaged download?); replacing it", stacklevel=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a reader (another process, a ddp rank) never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".air_passengers.")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temporary, path)
    return path


def quiet_lightning() -> None:
    """Silence Lightning's per-fit banners ("GPU available: ...", tips) and its notices about itself;
    warnings about the code stay. ``gpucourse.setup`` does this already (``preamble.quiet_libraries``,
    the one place that knows which messages); this name stays for lesson 9 and ``darts_ddp``."""
    from gpucourse.preamble import quiet_libraries

    quiet_libraries()


def trainer_kwargs(accelerator: str = "cpu", **extra: Any) -> dict:
    """``pl_trainer_kwargs`` for a readable notebook: the device choice plus no logger and no progress bar."""
    return {"accelerator": accelerator, "logger": False, "enable_progress_bar": False,
            "enable_model_summary": False, **extra}


def load_split_scale(dtype: str = "float32"):
    """The seed's data flow: load through Darts, cast, split after 1959-01, fit a Scaler on train only.

    Returns ``(series, train, val, scaler, train_scaled, val_scaled)``.
    """
    import pandas as pd
    from darts.dataprocessing.transformers import Scaler
    from darts.datasets import AirPassengersDataset

    write_air_passengers()  # a no-op when the file is there already
    series = AirPassengersDataset().load().astype(dtype)
    train, val = series.split_after(pd.Timestamp(SPLIT_AFTER))
    scaler = Scaler()  # fitted on train only: the validation months must not leak into the scaling
    train_scaled = scaler.fit_transform(train)
    return series, train, val, scaler, train_scaled, scaler.transform(val)


def seed_rnn(n_epochs: int, pl_trainer_kwargs: dict | None = None, **overrides: Any):
    """The seed's ``RNNModel`` (without ``log_tensorboard``: it needs tensorboard installed) for ``n_epochs``."""
    from darts.models import RNNModel

    return RNNModel(**{**SEED_RNN_KWARGS, "n_epochs": n_epochs, "pl_trainer_kwargs": pl_trainer_kwargs, **overrides})


def fit_and_score(model, train_scaled, val_scaled, val, scaler, dataloader_kwargs: dict | None = None) -> dict:
    """Fit ``model``, forecast the validation months, return ``{"mape", "fit_s", "forecast"}``."""
    from darts.metrics import mape

    start = time.perf_counter()
    model.fit(train_scaled, val_series=val_scaled, verbose=False,
              dataloader_kwargs={"pin_memory": False, **(dataloader_kwargs or {})})
    fit_s = time.perf_counter() - start
    forecast = scaler.inverse_transform(model.predict(len(val), verbose=False, dataloader_kwargs={"pin_memory": False}))
    return {"mape": float(mape(val, forecast)), "fit_s": fit_s, "forecast": forecast}


def first_line(error: BaseException) -> str:
    """``TypeName: first line of the message``: enough to recognise an error in a notebook's output."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def ddp_process_count(devices: int, num_workers: int) -> dict:
    """Processes a ``ddp``-family run starts on one machine: one per device, each with its own loader workers."""
    if devices < 1 or num_workers < 0:
        raise ValueError("devices >= 1 and num_workers >= 0")
    workers = devices * num_workers
    return {"trainers": devices, "loader_workers": workers, "total": devices + workers,
            "cores": os.cpu_count() or 1}


@contextlib.contextmanager
def darts_errors_unlogged():
    """Darts logs every error it raises (``darts.logging.raise_log``: "ValueError: ..." on stderr) and
    then raises it. Around a call that fails on purpose and whose error the cell catches and prints,
    that log line is a second copy that reads like a crash: this turns Darts' loggers down to CRITICAL
    for the block only (its warnings outside the block, and every error a student's code meets, stay)."""
    names = ["darts", *(n for n in list(logging.root.manager.loggerDict) if n.startswith("darts."))]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def plot_air_passengers(series) -> Any:
    """The AirPassengers series (lesson 9): data, not a measurement, so its source stands where the
    hardware would. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4))
    series.plot(ax=ax, label="AirPassengers")
    ax.set_title("AirPassengers: international airline passengers per month, 1949-1960\n"
                 "(data: Box & Jenkins 1976, series G; not a measurement of this machine)", fontsize=10)
    ax.set_xlabel("month")
    ax.set_ylabel("passengers (thousands)")
    fig.tight_layout()
    return fig


FLAT = 0.25  # a forecast whose spread is below this fraction of the actual months' spread reads as a flat line


def forecast_spread(actual, forecast) -> float:
    """The forecast's standard deviation over the actual series' on the months they share."""
    import numpy as np

    a = actual.slice_intersect(forecast).values().ravel()
    f = forecast.slice_intersect(actual).values().ravel()
    return float(np.std(f) / np.std(a)) if np.std(a) > 0 else float("nan")


def plot_forecast(series, forecast, epochs: int, full_epochs: int, mape: float, hardware: str) -> Any:
    """The actual series and a model's forecast (lesson 9), titled with the epochs, the MAPE and the
    hardware it trained on. A nearly flat forecast (see :data:`FLAT`) says on the chart why: the run
    trained too few epochs to learn the yearly season. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    series.plot(ax=ax, label="actual")
    forecast.plot(ax=ax, label=f"RNN forecast ({epochs} epochs)")
    ax.set_xlabel("month")
    ax.set_ylabel("passengers (thousands)")
    ax.set_title(f"RNN forecast after {epochs} epochs, validation MAPE {mape:.1f} %, trained on {hardware}", fontsize=10)
    if forecast_spread(series, forecast) < FLAT:
        if epochs < full_epochs:
            why = (f"A nearly flat line: {epochs} epochs (the smoke setting) are too few for this RNN to learn "
                   f"the yearly season; the full run trains {full_epochs}.")
        else:
            why = f"A nearly flat line: {epochs} epochs were not enough here for this RNN to learn the yearly season."
        ax.text(0.02, 0.97, textwrap.fill(why, 90), transform=ax.transAxes, fontsize=8, va="top",
                bbox={"facecolor": "lightyellow", "alpha": 0.9, "edgecolor": "grey"})
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_fit_times(rows: dict[str, tuple[float, float]], epochs: int, hardware: str) -> Any:
    """Lesson 9's comparison: one bar per run (``rows``: name -> (start-up s, training loop s)), stacked."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("no runs to plot")
    names = list(rows)
    setup = [s for s, _ in rows.values()]
    loops = [loop for _, loop in rows.values()]
    fig, ax = plt.subplots(figsize=(7, 3.0))
    ax.barh(names, setup, label="start-up (spawn, imports, setup)")
    ax.barh(names, loops, left=setup, label="training loop")
    ax.set_xlabel(f"wall time for {epochs} epochs (s)")
    ax.set_ylabel("run (processes x torch threads)")
    ax.set_title(f"Fitting the RNN on {hardware}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig
