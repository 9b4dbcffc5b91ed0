"""Checks for chapter 06's exercises (``notebooks/06_elastic.ipynb``).

* 06.1 ``restart_plan(crash_at, crashes, max_restarts)``: torchrun's exit status, the step each attempt of
  ``train.py`` starts at and the steps done more than once, against a step-by-step replay of ``train.py``'s
  loop (checkpoint every 3 steps, 12 steps) that agrees with the chapter's runs;
* 06.2 ``save_checkpoint(state, path)``: called on every rank of 1 and 3 ranks, rank 0's file is in place
  before any rank returns (rank 0 late) and holds rank 0's state; on 1 rank, a ``torch.save`` that fails halfway
  leaves the previous checkpoint loadable;
* 06.3 ``checkpoint(model, opt, sched)`` and ``restore(ckpt, model, opt, sched)``: on 2 DDP ranks with SGD
  momentum and ``StepLR``, a run resumed from a checkpoint at steps 3, 6 and 9 ends bit-for-bit equal to an
  uninterrupted one;
* 06.6 ``rest_of_epoch(n, epoch, old_world_size, batches_done, batch_size)``: on 1 and 4 ranks, after a change of
  world size mid-epoch, every sample the old ranks had not reached is trained on, with equal shares and no more
  padding than ``DistributedSampler``'s.

Exercises 4 and 5 ask what a report shows and when a prefix store is not enough: the chapter offers a
self-check (:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
import time

import torch

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "06_elastic"
STEPS, SAVE_EVERY = 12, 3  # train.py: 3 epochs of 4 batches, a checkpoint every 3 steps


# --------------------------------------------------------------------------- 06.1


def _replay(crash_at, crashes, max_restarts):
    """train.py's loop, step by step: (exit status, first step of each attempt, steps done more than once)."""
    checkpoint, starts, done = None, [], {}
    for attempt in range(max_restarts + 1):
        step = checkpoint or 0
        starts.append(step)
        crashed = False
        while step < STEPS:
            if step == crash_at and attempt < crashes:
                crashed = True
                break
            done[step] = done.get(step, 0) + 1
            step += 1
            if step % SAVE_EVERY == 0:
                checkpoint = step
        if not crashed:
            return 0, starts, sorted(s for s, n in done.items() if n > 1)
    return 1, starts, sorted(s for s, n in done.items() if n > 1)


@exercise("06.1", CHAPTER, "the restart plan of train.py: exit status, where each attempt starts, what is redone",
          "section 2 (the restart budget) and section 3 (checkpoint and resume)")
def check_restart_plan(restart_plan) -> str:
    cases = [(7, 0, 0), (7, 1, 0), (7, 1, 1), (6, 1, 1), (5, 1, 1), (0, 1, 1), (7, 2, 1), (8, 2, 2), (11, 1, 2),
             (3, 2, 3)]
    assert _replay(7, 1, 1) == (0, [0, 6], [6]) and _replay(7, 1, 0)[0] == 1  # the chapter's sections 3 and 6
    for crash_at, crashes, max_restarts in cases:
        expected = _replay(crash_at, crashes, max_restarts)
        got = restart_plan(crash_at, crashes, max_restarts)
        got = (got[0], list(got[1]), sorted(got[2])) if isinstance(got, (tuple, list)) and len(got) == 3 else got
        if got != expected:
            case = f"crash_at={crash_at}, crashes={crashes}, max_restarts={max_restarts}"
            if not isinstance(got, tuple) or got[0] != expected[0]:
                hint = "--max-restarts=N allows N restarts, N + 1 attempts; the job fails when a crash finds none left"
            else:
                hint = ("a restart resumes from the latest checkpoint on disk, written as soon as `step` reaches a "
                        "multiple of 3, before the next step's crash test")
            raise Wrong(case + " (exit status, first steps, steps redone)", expected, got, hint)
    return (f"your exit status, first steps and redone steps match a replay of train.py's loop in all {len(cases)} "
            "cases (no crash, a crash before step 0, right after a checkpoint, several crashes, budgets 0 to 3).")


# --------------------------------------------------------------------------- 06.2


class _FailsWhileSaved:
    """An object whose pickling raises: ``torch.save`` of a state that holds it fails halfway."""

    def __reduce__(self):
        raise RuntimeError("the process died in the middle of torch.save")


def _load(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=False)["written_by"]
    except FileNotFoundError:
        return "FileNotFoundError"
    except Exception as exc:  # a truncated file
        return f"{type(exc).__name__}: {str(exc).split(':')[0]}"


def _save_on_ranks(save_checkpoint, directory):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(directory, f"checkpoint-{world}.pt")
    seen = {}
    if rank == 0:
        time.sleep(0.5)  # rank 0 is late: the others must wait for its file
    save_checkpoint({"written_by": f"rank {rank}, step 6", "weights": torch.full((1000,), float(rank))}, path)
    seen["first save"] = _load(path)
    dist.barrier()
    if rank != 0:
        time.sleep(0.3)  # now the others are late: a rank that writes too would overwrite rank 0's file
    save_checkpoint({"written_by": f"rank {rank}, step 9", "weights": torch.full((1000,), float(rank))}, path)
    seen["second save"] = _load(path)
    dist.barrier()
    if world == 1:  # the failing save only on one rank: a rank that raises would leave the others in a barrier
        try:
            save_checkpoint({"written_by": "rank 0, step 12", "fails": _FailsWhileSaved()}, path)
            seen["failing save"] = "no error: torch.save did not fail?"
        except RuntimeError:
            seen["failing save"] = _load(path)
    return seen


@exercise("06.2", CHAPTER, "an atomic checkpoint written by rank 0", "section 3 (point 2: atomically, then a barrier)")
def check_save_checkpoint(save_checkpoint) -> str:
    expected = {"first save": "rank 0, step 6", "second save": "rank 0, step 9", "failing save": "rank 0, step 9"}
    hints = {"first save": "no rank may return before rank 0's file is in place; only rank 0 writes",
             "second save": "only rank 0 writes, and no rank returns before its new file is in place",
             "failing save": "a save that dies halfway must leave the previous checkpoint whole: write elsewhere, "
                             "then swap it in, in one step"}
    with tempfile.TemporaryDirectory(prefix="ddpkit-06.2-") as directory:
        for world in (1, 3):
            seen = _launch.launch(_save_on_ranks, world, args=(save_checkpoint, directory), timeout=20)
            for what in ("failing save", "first save", "second save"):
                got = [s[what] for s in seen if what in s]
                if got and got != [expected[what]] * len(got):
                    detail = " (rank 0 arrives 0.5 s late)" if what == "first save" else ""
                    raise Wrong(f"world_size={world}, {what}{detail}: what each rank loaded right after it returned",
                                [expected[what]] * len(got), got, hints[what])
    return ("on 1 and 3 ranks, with rank 0 late, every rank found rank 0's new checkpoint when it returned, "
            "and a torch.save that failed halfway left the previous checkpoint loadable.")


# --------------------------------------------------------------------------- 06.3


def _build(seed=0):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)


def _resume_on_ranks(checkpoint, restore, stops):
    import torch.distributed as dist
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own batches, as a sampler gives
    x, y = torch.randn(STEPS, 16, 8, generator=g), torch.randn(STEPS, 16, 1, generator=g)

    def run(model, opt, sched, first, last):
        for i in range(first, last):
            loss = F.mse_loss(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    def weights(model):
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    model, opt, sched = _build()
    run(model, opt, sched, 0, STEPS)
    reference = weights(model)
    out = {}
    for stop in stops:
        model, opt, sched = _build()
        run(model, opt, sched, 0, stop)
        buffer = io.BytesIO()
        torch.save(checkpoint(model, opt, sched), buffer)  # to "disk", as train.py does
        run(model, opt, sched, stop, min(stop + 2, STEPS))  # the steps the crash throws away
        model, opt, sched = _build(seed=1)  # the restarted worker: fresh objects
        buffer.seek(0)
        restore(torch.load(buffer, weights_only=False), model, opt, sched)
        run(model, opt, sched, stop, STEPS)
        out[stop] = float((weights(model) - reference).abs().max())
    return out


@exercise("06.3", CHAPTER, "a checkpoint that resumes a run with a learning-rate scheduler bit for bit",
          "section 3 (point 1: checkpoint everything whose state changes)")
def check_resume(attempt) -> str:
    checkpoint, restore = attempt["checkpoint"], attempt["restore"]
    stops = (3, 6, 9)
    found = _launch.launch(_resume_on_ranks, 2, args=(checkpoint, restore, stops), timeout=20)
    for stop in stops:
        diffs = [rank[stop] for rank in found]
        if any(d != 0 for d in diffs):
            raise Wrong(f"world_size=2, resumed from the checkpoint at step {stop} of {STEPS}: the largest weight "
                        "difference from the uninterrupted run, per rank", [0.0] * len(diffs), diffs,
                        "everything whose state changes as training goes belongs in the checkpoint: the weights, "
                        "SGD's momentum, and the scheduler's count of steps")
    return ("on 2 DDP ranks, runs resumed from checkpoints at steps 3, 6 and 9 (in fresh objects, after 2 lost "
            "steps) ended bit-for-bit equal to the uninterrupted run, StepLR's halvings included.")


# --------------------------------------------------------------------------- 06.6


def _done_before(n, epoch, old_world, batches_done, batch_size):
    """The samples the old ranks' DistributedSamplers (seed 0) had handed out in their first batches."""
    from torch.utils.data import DistributedSampler

    done = set()
    for rank in range(old_world):
        sampler = DistributedSampler(range(n), num_replicas=old_world, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        done.update(list(sampler)[:batches_done * batch_size])
    return done


def _rest_on_ranks(rest_of_epoch, cases):
    return [[int(i) for i in rest_of_epoch(*case)] for case in cases]


@exercise("06.6", CHAPTER, "the rest of an epoch after the world size changed",
          "section 3 (resuming mid-epoch) and chapter 05, section 1 (how DistributedSampler deals samples)")
def check_rest_of_epoch(rest_of_epoch) -> str:
    cases = {1: [(10, 1, 4, 2, 1)],
             4: [(10, 0, 4, 3, 1), (128, 1, 2, 2, 16), (100, 2, 3, 1, 7)]}
    for world, per_world in cases.items():
        shares = _launch.launch(_rest_on_ranks, world, args=(rest_of_epoch, per_world), timeout=20)
        for k, (n, epoch, old, batches, batch) in enumerate(per_world):
            case = (f"n={n}, epoch={epoch}, from {old} ranks after {batches} batch{'es' if batches > 1 else ''} of "
                    f"{batch} to {world} rank{'s' if world > 1 else ''}")
            left = set(range(n)) - _done_before(n, epoch, old, batches, batch)
            each = math.ceil(len(left) / world)
            mine = [rank[k] for rank in shares]
            if [len(s) for s in mine] != [each] * world:
                raise Wrong(f"{case}: share lengths ({len(left)} samples not done yet)", [each] * world,
                            [len(s) for s in mine], "every rank must do the same number of steps: split what is "
                            "left evenly, padding as DistributedSampler does")
            missed = sorted(left - {i for s in mine for i in s})
            if missed:
                raise Wrong(f"{case}: samples not done yet that no rank trains on", [], missed,
                            "the checkpoint's batch count is per rank of the old world: find which samples the old "
                            "ranks had done (the same shuffled order, seed + epoch), and share out the others")
    return ("on 1 and 4 ranks, after shrinking from 4 and growing from 2 and 3 ranks mid-epoch (epochs 0 to 2, a "
            "finished share included), the shares were equal and covered every sample not done yet.")
