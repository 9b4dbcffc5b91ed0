"""Checks for chapter 05's exercises (``notebooks/05_samplers.ipynb``).

* 05.1 ``padding_duplicates(n, world_size, epoch)``: which indices a shuffled ``DistributedSampler`` pads
  with, against the shares real ranks' samplers yield;
* 05.2 ``mean_test_loss(model, x, y)``: the exact mean test loss, run on every rank of 2 and 4 ranks
  (357 test images: uneven shares), against one process;
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


@exercise("05.1", CHAPTER, "the indices a shuffled DistributedSampler duplicates",
          "section 1 (which samples each rank gets) and section 2 (set_epoch)")
def check_padding_duplicates(padding_duplicates) -> str:
    cases = {world: [(n, epoch) for n in (3, 10, 7) if n % world for epoch in range(3)] for world in (4, 3)}
    checked = 0
    for world, per_world in cases.items():
        per_rank = _launch.launch(_shares, world, args=(per_world,), timeout=20)
        for k, (n, epoch) in enumerate(per_world):
            order = [i for position in zip(*(rank[k] for rank in per_rank)) for i in position]
            expected = order[n:]
            got = padding_duplicates(n, world, epoch)
            if list(got) != expected:
                raise Wrong(f"n={n}, world_size={world}, epoch={epoch}", expected, got,
                            "the sampler pads the list it is about to stride: the epoch's own order")
            checked += 1
    return (f"your duplicates equal the padding that real ranks' samplers used in all {checked} cases "
            "(3, 7 and 10 samples on 3 and 4 ranks, epochs 0 to 2).")


def _mean_loss_on_ranks(mean_test_loss):
    import ddpkit

    digits = ddpkit.load_digits()
    model = ddpkit.digits_mlp(seed=0).eval()
    return float(mean_test_loss(model, digits.x_test, digits.y_test))


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
    for world in (2, 4):
        got = _launch.launch(_mean_loss_on_ranks, world, args=(mean_test_loss,), timeout=20)
        if len(set(got)) != 1:
            raise Wrong(f"world_size={world}", f"the same mean on every rank, {truth:.8f}", got,
                        "every rank should end with the full test set's mean: combine the ranks' parts")
        if abs(got[0] - truth) > 1e-6:
            raise Wrong(f"world_size={world} ({n} test images: shares of {math.ceil(n / world)} and "
                        f"{n // world}, or padded to {math.ceil(n / world) * world})", round(truth, 8),
                        round(got[0], 8), "count each test image once, and weight ranks by how many images "
                        "they hold, not by rank")
    return (f"on 2 and 4 ranks every rank returned {truth:.8f}, the one-process mean of the {n} test losses "
            "(within 1e-6).")


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
