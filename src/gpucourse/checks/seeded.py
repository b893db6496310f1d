"""The global random state, for judges that rebuild a seeded model in the grader's process (lessons 3, 4,
7 and 8 rebuild the models their observers built, to compute the expected values themselves).

``nn.Linear`` draws its initial weights from torch's one global generator, and the grader judges
submissions in several threads at once: two judges seeding it at the same time would each get a model
made of the other's draws, and so would a judge whose seed and model another thread's draw falls between
(building any ``nn.Linear`` draws). The grader runs every judge inside ``global_rng()``: one at a
time, the state put back afterwards; a judge that seeds it says so with its own ``global_rng()`` too,
for callers outside the grader.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_LOCK = threading.RLock()


@contextlib.contextmanager
def global_rng(seed: int | None = None) -> Iterator[None]:
    """Within the block this thread alone uses torch's global random state (seeded with ``seed`` when
    given); the state it had before is restored afterwards."""
    import torch

    with _LOCK, torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def filled(model, seed: int):
    """``model`` with every ``nn.Linear``'s weight and bias drawn again, uniform in ±1/sqrt(in_features), from
    a generator of its own seeded ``seed``: the same values in an observer and in a judge, whatever else drew
    from torch's global generator (the answer, a thread)."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                bound = module.in_features ** -0.5
                for parameter in module.parameters():
                    draw = torch.rand(parameter.shape, generator=generator, dtype=torch.float64) * 2 - 1
                    parameter.copy_(draw * bound)
    return model
