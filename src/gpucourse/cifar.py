"""Lesson 4's data: CIFAR-10 offline in its real on-disk format, and a pl_bolts-compatible data module.

``pl_bolts`` (lightning-bolts) is unmaintained and does not import with Lightning 2.x, so
``CIFAR10DataModule`` here is a drop-in with its constructor, built on ``LightningDataModule`` and
torchvision's real ``CIFAR10``. Without a network (CI, many lab machines), ``write_cifar10`` writes a
small CIFAR-10 in the dataset's real on-disk format (pickled batches of uint8 rows in
``cifar-10-batches-py/``) plus a manifest of its md5 sums; ``OfflineCIFAR10`` is torchvision's class
pointed at that manifest, so torchvision's own parsing and integrity checks read it. Lesson 4 reaches
these through ``gpucourse.mixed_precision``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from gpucourse import environment

BASE_FOLDER = "cifar-10-batches-py"


MANIFEST = "gpucourse-manifest.json"


LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


OFFLINE_ENV = environment.OFFLINE  # set by `make test` and the grader: never try the network


CIFAR10_TRAIN_IMAGES = 50_000  # the real training set, which pl_bolts' integer val_split (5000 by default) counts in


def write_cifar10(root: str | os.PathLike, per_batch: int = 100, test: int = 100, seed: int = 0) -> Path:
    """A CIFAR-10 of ``5 * per_batch`` training and ``test`` test images, in the real file format.

    Each class gets its own mean colour plus noise, so a model can learn something in a few steps.
    """
    if per_batch < 1 or test < 1:
        raise ValueError("per_batch and test must be at least 1")
    folder = Path(root) / BASE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    colours = torch.randint(40, 216, (10, 3), generator=generator)

    def batch(n: int, label: str) -> dict:
        labels = torch.randint(0, 10, (n,), generator=generator)
        noise = torch.randint(-40, 41, (n, 3, 32 * 32), generator=generator)
        images = (colours[labels][:, :, None] + noise).clamp(0, 255).to(torch.uint8).reshape(n, 3072)
        return {"batch_label": label, "labels": labels.tolist(), "data": images.numpy(),
                "filenames": [f"generated_{label.replace(' ', '_')}_{i}.png" for i in range(n)]}

    files = {f"data_batch_{i}": batch(per_batch, f"training batch {i} of 5") for i in range(1, 6)}
    files["test_batch"] = batch(test, "testing batch 1 of 1")
    files["batches.meta"] = {"label_names": LABELS, "num_cases_per_batch": per_batch, "num_vis": 3072}
    digests = {}
    for name, content in files.items():
        with open(folder / name, "wb") as handle:
            pickle.dump(content, handle, protocol=2)
        digests[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(digests, indent=1))
    return folder


def _torchvision_cifar10():
    from torchvision.datasets import CIFAR10

    class OfflineCIFAR10(CIFAR10):
        """torchvision's CIFAR10; for a generated copy, its md5 list comes from the copy's manifest."""

        def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
            manifest = Path(root) / BASE_FOLDER / MANIFEST
            if manifest.is_file():
                digests = json.loads(manifest.read_text())
                self.train_list = [[f"data_batch_{i}", digests[f"data_batch_{i}"]] for i in range(1, 6)]
                self.test_list = [["test_batch", digests["test_batch"]]]
                self.meta = {"filename": "batches.meta", "key": "label_names", "md5": digests["batches.meta"]}
                download = False
            super().__init__(root, train=train, transform=transform, target_transform=target_transform, download=download)

    return OfflineCIFAR10


def OfflineCIFAR10(*args: Any, **kwargs: Any):  # noqa: N802 - a class, built lazily (torchvision is slow to import)
    return _torchvision_cifar10()(*args, **kwargs)


def validation_size(val_split: int | float, images: int, generated: bool) -> int:
    """How many of ``images`` training images ``val_split`` holds out, as pl_bolts' data module does.

    A float is a fraction and an int a count, exactly as in pl_bolts on the real 50,000 images (a count
    that leaves no training data is an error there, and here). On a small generated copy an int counts
    images of the real set, so it is scaled to the same fraction (5000 -> 10%: 50 of 500 images) and one
    line says so: code written for the real dataset runs unchanged offline.
    """
    if isinstance(val_split, float):
        if not 0 <= val_split < 1:
            raise ValueError(f"val_split={val_split} must be a fraction in [0, 1) or a number of images")
        return int(val_split * images)
    if generated and images < CIFAR10_TRAIN_IMAGES and val_split > 0:
        n_val = min(max(1, round(val_split * images / CIFAR10_TRAIN_IMAGES)), images - 1)
        print(f"val_split={val_split} counts images of CIFAR-10's {CIFAR10_TRAIN_IMAGES:,} training images; this "
              f"generated copy has {images}, so {n_val} ({100 * n_val / images:.0f}%) are held out for validation.")
        return n_val
    if not 0 <= val_split < images:
        raise ValueError(f"val_split={val_split} leaves no training data out of {images} images")
    return val_split


def _data_module_class():
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, random_split
    from torchvision import transforms

    class CIFAR10DataModule(pl.LightningDataModule):
        """Drop-in for ``pl_bolts.datamodules.CIFAR10DataModule``: same constructor and loaders.

        ``prepare_data`` (once, on one process) downloads CIFAR-10 when allowed and possible, and
        otherwise writes a small generated copy; ``setup`` (on every process) builds the datasets.
        """

        name, num_classes, dims = "cifar10", 10, (3, 32, 32)

        def __init__(self, data_dir: str | None = None, val_split: int | float = 5000, num_workers: int = 0,
                     normalize: bool = False, batch_size: int = 32, seed: int = 42, shuffle: bool = True,
                     pin_memory: bool = True, drop_last: bool = False, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.data_dir = data_dir or os.getcwd()
            self.val_split, self.num_workers, self.normalize = val_split, num_workers, normalize
            self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
            self.pin_memory, self.drop_last = pin_memory and torch.cuda.is_available(), drop_last
            self.generated = False

        def prepare_data(self) -> None:
            folder = Path(self.data_dir) / BASE_FOLDER
            if folder.is_dir():
                return
            if not environment.offline():
                try:
                    from torchvision.datasets import CIFAR10
                    CIFAR10(self.data_dir, train=True, download=True)
                    CIFAR10(self.data_dir, train=False, download=True)
                    return
                except Exception as error:  # no network: fall back to the generated copy
                    print(f"CIFAR-10 could not be downloaded ({type(error).__name__}); writing a small generated copy.")
            write_cifar10(self.data_dir)

        def _transform(self):
            steps = [transforms.ToTensor()]
            if self.normalize:
                steps.append(transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)))
            return transforms.Compose(steps)

        def setup(self, stage: str | None = None) -> None:
            self.generated = (Path(self.data_dir) / BASE_FOLDER / MANIFEST).is_file()
            full = OfflineCIFAR10(self.data_dir, train=True, transform=self._transform())
            n_val = validation_size(self.val_split, len(full), self.generated)
            generator = torch.Generator().manual_seed(self.seed)
            self.dataset_train, self.dataset_val = random_split(full, [len(full) - n_val, n_val], generator=generator)
            self.dataset_test = OfflineCIFAR10(self.data_dir, train=False, transform=self._transform())

        def _loader(self, dataset, shuffle: bool):
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                              drop_last=self.drop_last, pin_memory=self.pin_memory)

        def train_dataloader(self):
            return self._loader(self.dataset_train, self.shuffle)

        def val_dataloader(self):
            return self._loader(self.dataset_val, False)

        def test_dataloader(self):
            return self._loader(self.dataset_test, False)

    return CIFAR10DataModule


def CIFAR10DataModule(*args: Any, **kwargs: Any):  # noqa: N802 - see OfflineCIFAR10
    return _data_module_class()(*args, **kwargs)
