"""Checks for chapter 11's exercises (``notebooks/11_debugging.ipynb``).

* 11.1 ``skip_step(loss, limit)``: a loss-spike guard called on every rank after the gradient all-reduce,
  in section 7's training (seeded correctly) on 2 and 3 ranks, with a spike on the last rank, on rank 0,
  or none: the replicas never drift and every rank skips exactly the spiking step;
* 11.2 ``swapped``: what section 6's hang reports under a 2 s group and a 20 s launcher timeout (the
  error, the failed ranks, where each rank was), against that run made on 2 real ranks in the check;
* 11.4 ``check_replicas(model)``: equal replicas pass; the last bit of one number of one tensor changed
  on one rank (the last, or rank 0) makes every rank raise, naming the first tensor that differs and the
  odd rank, on 2 and 3 ranks.

Exercise 3 asks for an explanation: the chapter offers a self-check (:func:`ddpkit.exercises.reveal`).
The workers below rebuild the chapter's pieces they need (``sync_gradients``, section 6's early-stopping
training, section 7's model and replica hashes).
"""

from __future__ import annotations

import re

from .. import _launch
from .._errors import LaunchTimeoutError, RankFailedError
from ._core import Wrong, exercise

CHAPTER = "11_debugging"
SEED, STEPS, SPIKE_AT, LIMIT = 1, 6, 3, 30.0


def _sync_gradients(model):
    import torch.distributed as dist

    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _replica_hash(model):
    import hashlib

    import torch

    return {name: hashlib.sha1(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()).hexdigest()[:8]
            for name, t in model.state_dict().items()}


def _model():
    import torch
    import torch.nn as nn

    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))


# --------------------------------------------------------------------------- 11.1 a guard decided together


def _guarded_on_ranks(skip_step, spikes):
    """Section 7's training, seeded correctly, with a corrupted batch on (rank, step) in ``spikes``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank = dist.get_rank()
    out = []
    for spike in spikes:
        model = _model()
        torch.manual_seed(SEED + rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(100 + rank))
        hashes, skipped = [_replica_hash(model)], []
        for step in range(STEPS):
            batch = x * 5 if spike == (rank, step) else x
            loss = F.mse_loss(model(batch), batch.sum(1, keepdim=True))
            loss.backward()
            _sync_gradients(model)
            if skip_step(loss.detach(), LIMIT):
                skipped.append(step)
            else:
                optimizer.step()
            optimizer.zero_grad()
            hashes.append(_replica_hash(model))
        out.append((hashes, skipped))
    return out


def _first_drift(per_rank):
    for k, states in enumerate(zip(*per_rank)):
        differ = [name for name in states[0] if len({state[name] for state in states}) > 1]
        if differ:
            return k, differ
    return None


@exercise("11.1", CHAPTER, "a loss-spike guard the ranks decide together",
          "section 7 (replica hashes) and section 6's fix (deciding together)")
def check_skip_step(skip_step) -> str:
    for world in (2, 3):
        spikes = [None, (world - 1, SPIKE_AT), (0, 1)]
        per_rank = _launch.launch(_guarded_on_ranks, world, args=(skip_step, spikes), timeout=20)
        for k, spike in enumerate(spikes):
            label = (f"world_size={world}, " + ("no spike" if spike is None else
                                                f"rank {spike[0]}'s batch spikes at step {spike[1]}"))
            skipped = [rank[k][1] for rank in per_rank]
            drift = _first_drift([rank[k][0] for rank in per_rank])
            if drift is not None:
                raise Wrong(f"{label}: the first point at which the replicas differ", None,
                            f"point {drift[0]}, in {', '.join(drift[1])} (skipped steps per rank: {skipped})",
                            "a step skipped on one rank only parts the replicas: decide from every rank's loss")
            expected = [[] if spike is None else [spike[1]]] * world
            if skipped != expected:
                raise Wrong(f"{label}: the steps each rank skipped", expected, skipped,
                            "skip when any rank's loss is above the limit, and only then")
    return ("on 2 and 3 ranks, with a spike on the last rank, on rank 0 or none, every rank skipped exactly the "
            "spiking step and the replicas stayed bit for bit equal.")


# --------------------------------------------------------------------------- 11.2 the swapped timeouts

_DATA_SCALE = {0: 1.0, 1: 0.5}


def _train_until_good_in_a_short_group():
    """Section 6's early-stopping training, each rank deciding alone, in a 2 s group of its own."""
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    rank = dist.get_rank()
    x = _DATA_SCALE[rank] * torch.randn(64, 4, generator=torch.Generator().manual_seed(rank))
    true_w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(100):
        loss = F.mse_loss(model(x), x @ true_w)
        loss.backward()
        _sync_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.5:
            return step
    return None


def _function_at(traceback_text):
    """The innermost function of a traceback that is not PyTorch's own."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', traceback_text)
    ours = [fn for path, fn in frames if "torch" not in path.split("site-packages")[-1]]
    return ours[-1] if ours else None


_STEPS_FN = {"_sync_gradients": "sync_gradients", "_train_until_good_in_a_short_group": "train_until_good"}


@exercise("11.2", CHAPTER, "section 6's hang under a 2 s group and a 20 s launcher timeout",
          "section 6 (every rank's stack) and section 1 (the group's timeout)")
def check_swapped(swapped) -> str:
    if not isinstance(swapped, dict):
        raise Wrong("the answer", "the dict of the attempt cell, filled in", swapped, "keep the dict's keys")
    try:
        _launch.launch(_train_until_good_in_a_short_group, 2, init_process_group=False, timeout=20)
        raise Wrong("the real run", "an error", "the run finished", "rerun the check")  # cannot happen: rank 0 waits
    except RankFailedError as err:
        found = {"error": "RankFailedError", "failed ranks": sorted(f.rank for f in err.failures)}
        where = {f.rank: _function_at(f.traceback) for f in err.failures}
    except LaunchTimeoutError:
        found, where = {"error": "LaunchTimeoutError", "failed ranks": []}, {}
    found["rank 0 in"] = _STEPS_FN.get(where.get(0), where.get(0))
    found["rank 1 in"] = _STEPS_FN.get(where.get(1), where.get(1))
    hints = {"error": "which timeout runs out first now: the group's 2 s or the launcher's 20 s?",
             "failed ranks": "read the error's failures: which ranks raised?",
             "rank 0 in": "the function of the chapter's code in rank 0's traceback",
             "rank 1 in": "the function in rank 1's traceback: where does a rank wait after its function returned?"}
    for key, expected in found.items():
        got = swapped.get(key)
        if key == "error" and isinstance(got, type):
            got = got.__name__
        if key == "failed ranks":
            try:
                got = sorted(int(r) for r in got)
            except TypeError:
                pass
        if got != expected:
            raise Wrong(f"{key!r}, from 2 real ranks run just now with a 2 s group and a 20 s launcher timeout",
                        expected, swapped.get(key), hints[key])
    return ("that is what 2 real ranks reported just now: gloo's 2 s timeout fires first, both ranks fail, their "
            "tracebacks say where they were; the launcher's live stacks of every rank are gone.")


# --------------------------------------------------------------------------- 11.4 check_replicas


def _replicas_on_ranks(check_replicas, cases):
    import torch
    import torch.distributed as dist

    rank, out = dist.get_rank(), []
    for odd, tensor in cases:
        model = _model()
        if rank == odd:
            with torch.no_grad():                                 # one number, its last bit: allclose misses it
                first = model.state_dict()[tensor].view(-1)[:1]
                first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))
        try:
            check_replicas(model)
            out.append(None)
        except Exception as exc:                                  # noqa: BLE001 (any error the learner raises)
            out.append(f"{type(exc).__name__}: {exc}")
        dist.barrier()
    return out


@exercise("11.4", CHAPTER, "check_replicas: every rank raises, naming the first tensor and the odd rank",
          "section 7 (replica hashes)")
def check_check_replicas(check_replicas) -> str:
    checked = 0
    for world in (2, 3):
        cases = [(None, None), (world - 1, "3.weight"), (0, "0.bias")]
        per_rank = _launch.launch(_replicas_on_ranks, world, args=(check_replicas, cases), timeout=20)
        for k, (odd, tensor) in enumerate(cases):
            raised = [rank[k] for rank in per_rank]
            if odd is None:
                if any(raised):
                    raise Wrong(f"world_size={world}, equal replicas", "no error on any rank", raised,
                                "equal replicas must pass: hash each tensor's bytes the same way on every rank")
                continue
            label = f"world_size={world}, rank {odd}'s {tensor} differs in the last bit of one number"
            if not all(raised):
                hint = ("raise on every rank, from what every rank gathered, or the others train on" if any(raised)
                        else "replicas agree bit for bit or not at all: compare exact bytes (hashes), not allclose")
                raise Wrong(f"{label}: which ranks raised", f"all {world} ranks",
                            [r for r, text in enumerate(raised) if text], hint)
            for r, text in enumerate(raised):
                named = [name for name in ("0.weight", "0.bias", "3.weight", "3.bias") if name in text]
                if named != [tensor]:
                    raise Wrong(f"{label}: the tensor rank {r}'s error names", tensor, text,
                                "name the first tensor that differs, and only it")
                if not re.search(rf"(?<![\w.]){odd}(?![\w.])", text.replace(tensor, "")):
                    raise Wrong(f"{label}: who disagrees, in rank {r}'s error", f"a message naming rank {odd}",
                                text, "group the ranks by the hash they hold, and say which ranks hold which")
            checked += 1
    return (f"on 2 and 3 ranks equal replicas passed and, in all {checked} cases of one number's last bit changed "
            "on one rank, every rank raised, naming the first tensor that differs and the odd rank.")
