"""The course's dataset: 1,797 real handwritten digits, shipped in ``data/``.

Distributed training is easiest to understand on a problem small enough that
every experiment finishes in seconds on a laptop CPU, yet real enough that
accuracy means something. The UCI handwritten digits fit: 8x8 grey-scale
images, ten classes, 57 KB on disk (source, license and split: ``data/README.md``).

:func:`load_digits` reads the file that ships with the repository (no
download, ever) and returns plain tensors with a *fixed* split: the first
1,440 samples train, the last 357 test. Plain tensors, not a ``Dataset``
class, because ``torch.utils.data.TensorDataset`` already does the rest and
chapters 04 and 05 want to show exactly which index goes to which rank.
1,440 divides evenly by 1, 2, 4 and 8 ranks; 357 does not, on purpose.

:func:`digits_mlp` builds the small classifier the chapters train; its
``seed`` makes every rank (or every run) start from the same weights, which
is what the equivalence experiments compare against.

:class:`PidTagged` wraps a dataset so that every sample also says which
process loaded it: chapter 05 counts the DataLoader worker processes a rank
starts with it. It lives here, in an importable module, because a spawned
worker re-creates the dataset by importing its class; a class defined in a
notebook cell lives in ``__main__``, which a spawned worker cannot import
(``AttributeError: Can't get attribute ... on <module '__main__'>``).

>>> d = load_digits()
>>> d.x_train.shape, d.y_train.shape, d.x_test.shape
(torch.Size([1440, 64]), torch.Size([1440]), torch.Size([357, 64]))
"""

from __future__ import annotations

import gzip
import pathlib
from typing import NamedTuple

#: Where ``load_digits`` looks: ``data/`` next to the ``ddpkit`` package (an editable install from the repo).
DATA_DIR = pathlib.Path(__file__).resolve().parent.parent / "data"
DIGITS_FILE = "digits.csv.gz"
N_TRAIN = 1440  # samples 0..1439 train, 1440..1796 test


class Digits(NamedTuple):
    """The fixed train/test split: float pixels in ``[0, 1]`` of shape ``(n, 64)``, int64 labels."""

    x_train: "torch.Tensor"  # noqa: F821
    y_train: "torch.Tensor"  # noqa: F821
    x_test: "torch.Tensor"  # noqa: F821
    y_test: "torch.Tensor"  # noqa: F821


_CACHE: dict[pathlib.Path, tuple] = {}


def _read(path: pathlib.Path):
    import torch

    if path not in _CACHE:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing. ddpkit reads the digits from the repository's data/ folder: "
                "install ddpkit from a checkout with `pip install -e .`, or pass data_dir= pointing "
                "at a folder holding digits.csv.gz (`python data/make_digits.py` re-creates it)."
            )
        with gzip.open(path, "rt") as f:
            rows = [[int(v) for v in line.split(",")] for line in f if line.strip()]
        table = torch.tensor(rows, dtype=torch.int64)
        if table.shape != (1797, 65):
            raise ValueError(f"{path}: expected 1797 rows of 65 integers, got {tuple(table.shape)}")
        _CACHE[path] = (table[:, :64].float() / 16.0, table[:, 64].clone())
    x, y = _CACHE[path]
    return x.clone(), y.clone()


def load_digits(data_dir: str | pathlib.Path | None = None) -> Digits:
    """The UCI digits as tensors, with the course's fixed split (first 1,440 train, last 357 test).

    Pixels are scaled from 0..16 to ``[0, 1]``; reshape a row to ``(8, 8)``
    to see the image. The file is parsed once per process and cached; every
    call returns fresh tensors, so changing them changes nothing for the next
    caller. ``data_dir`` overrides where ``digits.csv.gz`` is read from.

    >>> d = load_digits()
    >>> d.y_train[:10].tolist()          # the file cycles through the classes
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> float(d.x_train.min()), float(d.x_train.max()), d.y_test.bincount().tolist()
    (0.0, 1.0, [35, 36, 34, 36, 36, 37, 37, 36, 33, 37])
    """
    path = (pathlib.Path(data_dir) if data_dir is not None else DATA_DIR) / DIGITS_FILE
    x, y = _read(path.resolve())
    return Digits(x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:])


def digits_mlp(hidden: int = 64, depth: int = 1, seed: int | None = 0):
    """A small MLP for the digits: ``64 -> hidden (-> hidden ...) -> 10`` with ReLUs.

    ``depth`` is the number of hidden layers. With a ``seed`` the weights are
    the same in every process that builds it (the global RNG is left
    untouched); ``seed=None`` draws from the global RNG, as ``nn.Linear``
    normally does.

    >>> model = digits_mlp()
    >>> model
    Sequential(
      (0): Linear(in_features=64, out_features=64, bias=True)
      (1): ReLU()
      (2): Linear(in_features=64, out_features=10, bias=True)
    )
    >>> sum(p.numel() for p in model.parameters())
    4810
    >>> bool(digits_mlp()[0].weight.equal(model[0].weight))   # same seed, same weights
    True
    """
    import contextlib

    import torch
    from torch import nn

    layers: list[nn.Module] = []
    width = 64
    with torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext():
        if seed is not None:
            torch.manual_seed(seed)
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


class PidTagged:
    """A dataset whose samples are ``dataset[i]`` plus the id of the process that loaded them.

    ``PidTagged(TensorDataset(x, y))[i]`` is ``(x[i], y[i], os.getpid())``; a
    non-tuple sample ``s`` becomes ``(s, pid)``. Loaded through a
    ``DataLoader``, the last field of each batch is a tensor of process ids:
    the loop's own pid with ``num_workers=0``, a worker's pid otherwise, so
    the distinct ids count the worker processes that produced the batches.

    >>> import os, torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> tagged = PidTagged(TensorDataset(torch.arange(6.0), torch.arange(6)))
    >>> len(tagged), tagged[2][:2], tagged[2][2] == os.getpid()
    (6, (tensor(2.), tensor(2)), True)
    >>> {int(pid) for _, _, pids in DataLoader(tagged, batch_size=4) for pid in pids} == {os.getpid()}
    True
    """

    def __init__(self, dataset):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"PidTagged wraps a map-style dataset (with __getitem__ and __len__), got {type(dataset).__name__}; "
                "wrap tensors first, e.g. PidTagged(TensorDataset(x, y))"
            )
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        import os

        sample = self.dataset[index]
        return (*sample, os.getpid()) if isinstance(sample, tuple) else (sample, os.getpid())
