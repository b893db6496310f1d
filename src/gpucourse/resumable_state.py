"""Lesson 16's ``Stateful`` objects: what a checkpoint holds besides the model's and optimizer's tensors
(``torch.distributed.checkpoint.stateful.Stateful``: ``state_dict()`` and ``load_state_dict()``, which DCP
calls on save and load). ``gpucourse.checkpoints``'s resume demo saves and loads them on every rank.
"""

from __future__ import annotations

import torch

DATASET_ROWS, LOADER_BATCH = 48, 8  # 6 global batches per epoch: a resume at step 5 of 8 crosses an epoch


class AppState:
    """Model and optimizer as one ``Stateful`` (lesson 16): DCP calls ``state_dict()`` on save and on load
    (to get the tensors it fills in place), then ``load_state_dict()``; the DCP tutorial's ``AppState``."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])


class ResumableSampler:
    """A shuffling sampler that remembers where it is, ``Stateful`` (lesson 16): each epoch a new order of
    ``rows`` indices (from ``seed`` and the epoch alone), cut into global batches of ``batch``; its state is the
    epoch and how many batches of it were handed out."""

    def __init__(self, rows: int = DATASET_ROWS, batch: int = LOADER_BATCH, seed: int = 0):
        self.rows, self.batch, self.seed = rows, batch, seed
        self.epoch, self.position = 0, 0

    def next_batch(self) -> list[int]:
        """The next global batch's row indices (every rank gets the same list and takes its slice)."""
        if self.position == self.rows // self.batch:  # epoch done: a new order
            self.epoch, self.position = self.epoch + 1, 0
        order = torch.randperm(self.rows, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
        start, self.position = self.position * self.batch, self.position + 1
        return order[start:start + self.batch].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class RankRNG:
    """This rank's random generators as a ``Stateful`` (lesson 16), under a key of its own (``rank<R>``): ranks
    draw different dropout masks, and DCP writes a key that every rank saves only once.

    ``cuda``: the run draws on the GPU too (its tensors live there), so the GPU's generator is saved and loaded
    with the CPU's. It is an argument, not a guess from ``torch.cuda.is_initialized()``: DCP loads into the keys
    that ``state_dict()`` returns at load time, so they must be the keys it returned at save time, and a library
    may start CUDA in one process of a CPU run and not in the other (seen on an H200: "Missing key in checkpoint
    state_dict: rng.rank0.cuda")."""

    def __init__(self, rank: int, cuda: bool = False):
        self.key, self.cuda = f"rank{rank}", cuda

    def state_dict(self) -> dict:
        state = {"cpu": torch.get_rng_state()}
        if self.cuda:
            state["cuda"] = torch.cuda.get_rng_state()
        return {self.key: state}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state[self.key]["cpu"])
        if self.cuda:
            torch.cuda.set_rng_state(state[self.key]["cuda"])
