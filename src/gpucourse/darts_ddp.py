"""Lesson 9: the seed's Darts RNNModel trained on several devices with ``ddp_spawn``, as a script.

    python -m gpucourse.darts_ddp --devices 2 --epochs 3 --out result.json [--accelerator cpu|gpu]

``ddp_spawn`` starts one fresh Python process per device; each re-imports this file as
``__mp_main__`` to unpickle what it needs, so the training must sit behind the
``if __name__ == "__main__":`` guard (otherwise every child would start training, and spawning, again).
The result file holds the validation MAPE, the wall time and what each rank saw (its pid, rank,
``torch.distributed``'s world size and how many batches it trained on per epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl
import torch


class RankReport(pl.Callback):
    """Each rank writes what it saw to ``folder/rank<k>.json`` when training ends (a spawned rank returns nothing)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.started = 0.0

    def on_train_start(self, trainer, pl_module):
        self.started = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        report = {"rank": trainer.global_rank, "pid": os.getpid(), "trainer_world_size": trainer.world_size,
                  "dist_world_size": torch.distributed.get_world_size() if distributed else 1,
                  "backend": torch.distributed.get_backend() if distributed else None,
                  "batches_per_epoch": int(trainer.num_training_batches), "threads": torch.get_num_threads(),
                  "loop_s": time.perf_counter() - self.started}  # the training loop alone: no start-up
        Path(self.folder, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


class EndProcessGroup(pl.Callback):
    """Each rank ends torch.distributed when its fit is over (``gpucourse.launch.close_process_group``).

    Lightning destroys a gloo process group nowhere (only an NCCL one, at exit): a spawned rank would
    leave it to interpreter shutdown, where gloo's threads can abort the rank ("terminate called without
    an active exception", SIGABRT) and ``ddp_spawn`` then fails the whole script. After ``teardown`` a
    rank only sends its weights to the main process, through a pipe: no collective is left."""

    def teardown(self, trainer, pl_module, stage):
        from gpucourse.launch import close_process_group

        if stage == "fit":
            close_process_group()


def rank_reports(folder: str | os.PathLike) -> list[dict]:
    """Every rank's report, in rank order (read by the course's one reader, gpucourse.launch)."""
    from gpucourse.launch import read_rank_reports

    return list(read_rank_reports(folder).values())


def train(devices: int, epochs: int, accelerator: str = "cpu", threads: int | None = None) -> dict:
    """Fit the seed's RNNModel on ``devices`` devices (``ddp_spawn`` when more than one), forecast, score.

    ``threads`` sets torch's CPU threads in this process; ddp ranks get ``cores // devices`` from Lightning.
    """
    from darts.metrics import mape

    from gpucourse import darts_forecasting as F

    if threads:
        torch.set_num_threads(threads)
    F.quiet_lightning()
    start = time.perf_counter()
    _, _, val, scaler, train_scaled, val_scaled = F.load_split_scale()
    strategy = "ddp_spawn" if devices > 1 else "auto"
    with tempfile.TemporaryDirectory(prefix="darts_ddp_") as reports:
        model = F.seed_rnn(epochs, F.trainer_kwargs(accelerator, devices=devices, strategy=strategy,
                                                    callbacks=[RankReport(reports), EndProcessGroup()]))
        fit_start = time.perf_counter()
        model.fit(train_scaled, val_series=val_scaled, verbose=False, dataloader_kwargs={"pin_memory": False})
        fit_s = time.perf_counter() - fit_start
        ranks = rank_reports(reports)
    # Forecast with a one-device trainer: with the training kwargs, predict() would spawn ranks again.
    one = pl.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False)
    forecast = scaler.inverse_transform(model.predict(len(val), trainer=one, verbose=False,
                                                         dataloader_kwargs={"pin_memory": False}))
    return {"devices": devices, "accelerator": accelerator, "strategy": strategy, "epochs": epochs,
            "mape": float(mape(val, forecast)), "fit_s": fit_s, "wall_s": time.perf_counter() - start,
            "main_pid": os.getpid(), "world_size": max((r["dist_world_size"] for r in ranks), default=0),
            "ranks": ranks, "cpu_count": os.cpu_count()}


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, train, write the JSON result to ``--out`` (and print it)."""
    parser = argparse.ArgumentParser(prog="python -m gpucourse.darts_ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = train(args.devices, args.epochs, args.accelerator, args.threads)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "ranks"}), file=sys.stdout)
    return result


if __name__ == "__main__":
    torch.multiprocessing.freeze_support()  # a no-op except in frozen Windows executables; harmless elsewhere
    main()
