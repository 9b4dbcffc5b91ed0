"""Checks for chapter 05's exercises (``notebooks/05_samplers.ipynb``).

* 05.1 ``padding_duplicates(n, world_size, epoch)``: which indices a shuffled ``DistributedSampler`` pads
  with, against the shares real ranks' samplers yield, for 1 to 12 samples on 1, 3 and 4 ranks (even
  splits that pad nothing, and padding longer than the dataset among them), smallest case first;
* 05.2 ``mean_test_loss(model, x, y)``: the exact mean test loss, run on every rank of 1, 2 and 4 ranks
  (357 test images: uneven shares), against one process; each rank may pass at most its share
  (``ceil(357 / world_size)`` rows) through the model;
* 05.4 ``DistributedLengthGroupedSampler``: complete, equal, padded shares that follow ``set_epoch`` and
  batches of similar lengths, on 1 and 4 ranks.

Exercises 3 and 5 ask for a measurement and an explanation: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import math

import torch

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "05_samplers"


def _shares(cases):
    """On each rank: what ``DistributedSampler(range(n), shuffle=True, seed=0)`` yields at each epoch."""
    from torch.utils.data.distributed import DistributedSampler

    out = []
    for n, epoch in cases:
        sampler = DistributedSampler(range(n), shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


_PADDING_SIZES = {1: (1, 3, 7), 3: (1, 2, 3, 7, 10), 4: (1, 2, 3, 7, 8, 10, 12)}  # world size: dataset sizes


@exercise("05.1", CHAPTER, "the indices a shuffled DistributedSampler duplicates",
          "section 1 (which samples each rank gets) and section 2 (set_epoch)")
def check_padding_duplicates(padding_duplicates) -> str:
    cases = []  # (n, world_size, epoch, what real ranks' samplers padded with)
    for world, sizes in _PADDING_SIZES.items():
        per_world = [(n, epoch) for n in sizes for epoch in range(3)]
        per_rank = _launch.launch(_shares, world, args=(per_world,), timeout=20)
        for k, (n, epoch) in enumerate(per_world):
            order = [i for position in zip(*(rank[k] for rank in per_rank)) for i in position]
            cases.append((n, world, epoch, order[n:]))
    for n, world, epoch, expected in sorted(cases):  # the smallest case first
        got = padding_duplicates(n, world, epoch)
        got = list(got) if isinstance(got, (list, tuple, range, torch.Tensor)) else got
        got = [int(i) for i in got] if isinstance(got, list) and all(isinstance(i, (int, torch.Tensor))
                                                                     for i in got) else got
        if got == expected:
            continue
        if not expected:
            hint = "when world_size divides n, every rank already gets as many samples: the sampler pads nothing"
        elif len(expected) > n:
            hint = ("the padding can be longer than the dataset: the sampler then wraps around its order more "
                    "than once (the deeper notebook's section 1 covers a dataset smaller than the world size)")
        else:
            hint = "the sampler pads the list it is about to stride: the epoch's own order"
        raise Wrong(f"n={n}, world_size={world}, epoch={epoch}", expected, got, hint)
    return (f"your duplicates equal the padding that real ranks' samplers used in all {len(cases)} cases "
            "(1 to 12 samples on 1, 3 and 4 ranks, even splits among them, epochs 0 to 2).")


class _CountingRows(torch.nn.Module):
    """The model, counting the rows (test images) that go through it on this rank."""

    def __init__(self, model):
        super().__init__()
        self.model, self.rows = model, 0

    def forward(self, x):
        self.rows += int(x.shape[0]) if x.dim() > 1 else 1
        return self.model(x)


def _mean_loss_on_ranks(mean_test_loss):
    import ddpkit

    digits = ddpkit.load_digits()
    model = _CountingRows(ddpkit.digits_mlp(seed=0)).eval()
    got = mean_test_loss(model, digits.x_test, digits.y_test)
    number = isinstance(got, (int, float)) and not isinstance(got, bool)
    if number or isinstance(got, torch.Tensor) and got.numel() == 1:
        got = float(got)
    return got, model.rows


@exercise("05.2", CHAPTER, "the exact mean test loss across ranks",
          "section 4 (exact evaluation across ranks)")
def check_mean_test_loss(mean_test_loss) -> str:
    import torch.nn.functional as F

    from .. import _data

    digits = _data.load_digits()
    model = _data.digits_mlp(seed=0).eval()
    with torch.no_grad():
        truth = F.cross_entropy(model(digits.x_test), digits.y_test, reduction="none").double().mean().item()
    n = len(digits.y_test)
    for world in (1, 2, 4):
        per_rank = _launch.launch(_mean_loss_on_ranks, world, args=(mean_test_loss,), timeout=20)
        got, rows = [mean for mean, _ in per_rank], [r for _, r in per_rank]
        case = f"world_size={world}"
        if not all(isinstance(g, float) for g in got):
            raise Wrong(case, "one number (a float) on every rank", got, "return the mean as a Python float")
        if len(set(got)) != 1:
            raise Wrong(case, f"the same mean on every rank, {truth:.8f}", got,
                        "every rank should end with the full test set's mean: combine the ranks' parts")
        if abs(got[0] - truth) > 1e-6:
            raise Wrong(f"{case} ({n} test images: shares of {math.ceil(n / world)} and "
                        f"{n // world}, or padded to {math.ceil(n / world) * world})", round(truth, 8),
                        round(got[0], 8), "count each test image once, and weight ranks by how many images "
                        "they hold, not by rank")
        most = math.ceil(n / world)
        if max(rows) > most:
            raise Wrong(f"{case} ({n} test images): the rows each rank passed through the model",
                        f"at most {most} on each rank (its share)", rows,
                        "each rank evaluates only its own share of the test set, then the ranks combine their "
                        "parts: one rank evaluating everything alone is not distributed evaluation")
    return (f"on 1, 2 and 4 ranks every rank evaluated only its share and returned {truth:.8f}, the one-process "
            f"mean of the {n} test losses (within 1e-6).")


def _grouped_on_ranks(sampler_class, cases):
    out = []
    for lengths in cases:
        sampler = sampler_class(lengths, seed=0)
        shares = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        out.append(shares)
    return out


def _spread(share, lengths, batch=20):
    spreads = [max(lengths[i] for i in share[s:s + batch]) - min(lengths[i] for i in share[s:s + batch])
               for s in range(0, len(share), batch)]
    return sum(spreads) / len(spreads)


@exercise("05.4", CHAPTER, "a DistributedLengthGroupedSampler",
          "section 1 (padding) and section 2 (the shared seed)")
def check_length_grouped(sampler_class) -> str:
    from torch.utils.data.distributed import DistributedSampler

    lengths = torch.randint(5, 500, (2_000,), generator=torch.Generator().manual_seed(0)).tolist()
    cases = {1: [lengths[:50]], 4: [lengths[:3], lengths[:1_998], lengths]}
    for world, per_world in cases.items():
        per_rank = _launch.launch(_grouped_on_ranks, world, args=(sampler_class, per_world), timeout=20)
        for k, case in enumerate(per_world):
            n, total = len(case), math.ceil(len(case) / world) * world
            label = f"{n} samples on {world} rank{'s' if world > 1 else ''}"
            for epoch in (0, 1):
                shares = [rank[k][epoch] for rank in per_rank]
                together = [i for share in shares for i in share]
                if [len(s) for s in shares] != [total // world] * world:
                    raise Wrong(f"{label}, epoch {epoch}: share lengths", [total // world] * world,
                                [len(s) for s in shares], "every rank must get the same number of samples: pad")
                if sorted(set(together)) != list(range(n)) or len(together) - len(set(together)) != total - n:
                    raise Wrong(f"{label}, epoch {epoch}: samples covered and duplicated",
                                f"all {n} samples, {total - n} duplicated", f"{len(set(together))} distinct, "
                                f"{len(together) - len(set(together))} duplicated",
                                "all ranks must cut one shared order: the same generator seed on every rank")
            if n > 10 and [rank[k][0] for rank in per_rank] == [rank[k][1] for rank in per_rank]:
                raise Wrong(f"{label}: epochs 0 and 1", "a different order after set_epoch(1)",
                            "the same order", "seed the shuffle with seed + epoch")
            if n == 2_000:
                plain = DistributedSampler(range(n), num_replicas=world, rank=0, seed=0)
                plain.set_epoch(0)
                ours, theirs = _spread(per_rank[0][k][0], case), _spread(list(plain), case)
                if ours > theirs / 3:
                    raise Wrong(f"{label}: mean length spread of rank 0's batches of 20",
                                f"under a third of DistributedSampler's {theirs:.0f}", round(ours, 1),
                                "sort each chunk of 100 * world_size by length before striding")
    return ("on 1 and 4 ranks (50, 3, 1,998 and 2,000 samples) the shares were equal, covered every sample "
            "with exactly the padding DistributedSampler uses, changed with set_epoch, and batches of 20 "
            "spanned under a third of DistributedSampler's length range.")
