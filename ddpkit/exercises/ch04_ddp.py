"""Checks for chapter 04's exercises (``notebooks/04_ddp.ipynb``).

* 04.2 ``buckets_per_backward(model, bucket_cap_mb, steps=3)``: how many buckets DDP all-reduces in each
  backward pass, for section 4's model with a 10 KB cap and with the default cap, and for a model large
  enough to get a second bucket from the default cap, on 1 and 2 ranks, against DDP's own count;
* 04.5 ``{"state": EverySecondStep, "hook": every_second_step_hook}``: a communication hook that
  all-reduces every second step and reuses the previous average otherwise, trained 10 steps with momentum
  on 2 and 3 ranks with a 1 KB bucket cap (2 buckets per backward, so counting hook calls is not counting
  steps): replicas bit-identical after every step, each step's gradient either that step's mean or
  exactly the previous one, and about every second step without communication;
* 04.6 ``step_costs(per_rank_batch)``: the bytes DDP all-reduces per step and the compute and all-reduce
  times of ``digits_mlp(hidden=1024, depth=2)`` at per-rank batches of 16 and 256, on 2 ranks, against
  the exact byte count and times measured in the same check (a wide margin: timings vary by machine).

Exercises 1, 3 and 4 ask for a comparison and an explanation: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import time

import torch

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "04_ddp"

# --------------------------------------------------------------------------- 04.2 buckets per backward

_BUCKET_CASES = [  # (label, digits_mlp keyword arguments, bucket_cap_mb)
    ("section 4's model (64 -> 64 -> 64 -> 10), bucket_cap_mb=0.01", {"hidden": 64, "depth": 2}, 0.01),
    ("section 4's model, the default bucket_cap_mb=None", {"hidden": 64, "depth": 2}, None),
    ("digits_mlp(hidden=1024, depth=2), the default bucket_cap_mb=None", {"hidden": 1024, "depth": 2}, None),
]


def _reference_buckets(model, bucket_cap_mb, steps=3):
    """DDP's own count: a hook that logs each bucket, per backward pass."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .. import _data

    rank, data = dist.get_rank(), _data.load_digits()
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    counts = []

    def counting(state, bucket):
        counts[-1] += 1
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    x, y = data.x_train[rank * 16:(rank + 1) * 16], data.y_train[rank * 16:(rank + 1) * 16]
    for _ in range(steps):
        counts.append(0)
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
    return counts


def _buckets_on_ranks(buckets_per_backward):
    from .. import _data

    out = []
    for _, shape, cap in _BUCKET_CASES:
        got = buckets_per_backward(_data.digits_mlp(seed=0, **shape), cap, 3)
        expected = _reference_buckets(_data.digits_mlp(seed=0, **shape), cap, 3)
        out.append((None if got is None else [int(n) for n in got], expected))
    return out


@exercise("04.2", CHAPTER, "how many buckets each backward all-reduces",
          "section 4 (what happens inside backward()) and its link on iteration 0")
def check_buckets_per_backward(buckets_per_backward) -> str:
    for world in (1, 2):
        per_rank = _launch.launch(_buckets_on_ranks, world, args=(buckets_per_backward,), timeout=20)
        for k, (label, _, _) in enumerate(_BUCKET_CASES):
            got, expected = per_rank[0][k]
            case = f"{label}, 3 backward passes on {world} rank{'s' if world > 1 else ''}"
            if got != expected:
                raise Wrong(case, expected, got, "a communication hook runs once per bucket in every backward: "
                            "count each backward's calls on their own (and remember what iteration 0 does)")
            if any(rank[k][0] != got for rank in per_rank):
                raise Wrong(case, f"{expected} on every rank", [rank[k][0] for rank in per_rank],
                            "every rank all-reduces the same buckets: count on each rank")
    small, default, large = (expected for _, expected in per_rank[0])
    return (f"on 1 and 2 ranks your counts equal DDP's own: section 4's model {small} with the 10 KB cap but "
            f"{default} with the default cap (one bucket, so no overlap), the 1024-wide model {large}.")


# --------------------------------------------------------------------------- 04.5 a hook that skips steps


#: 04.5's bucket cap: section 4's model then gets 2 buckets per backward (after iteration 0), so a hook that
#: counts its calls instead of the steps skips half of a step's buckets.
_HOOK_BUCKET_CAP_MB = 0.001


def _hook_on_ranks(state_class, hook, steps=10, per_rank_batch=16):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import parameters_to_vector

    from .. import _data

    rank, world = dist.get_rank(), dist.get_world_size()
    data = _data.load_digits()
    model = DDP(_data.digits_mlp(seed=0), bucket_cap_mb=_HOOK_BUCKET_CAP_MB)
    model.register_comm_hook(state_class(), hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    local = _data.digits_mlp(seed=0)
    out = []
    for step in range(steps):
        first = ((step * world + rank) * per_rank_batch) % (1440 - per_rank_batch)
        x, y = data.x_train[first:first + per_rank_batch], data.y_train[first:first + per_rank_batch]
        local.load_state_dict(model.module.state_dict())          # this step's true mean, computed apart
        local.zero_grad()
        F.cross_entropy(local(x), y).backward()
        mean = parameters_to_vector([p.grad for p in local.parameters()])
        dist.all_reduce(mean)
        mean /= world
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grad = parameters_to_vector([p.grad for p in model.parameters()]).detach().clone()
        opt.step()
        flat = parameters_to_vector(model.parameters()).detach()
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        out.append((grad, mean, all(torch.equal(everyone[0], t) for t in everyone)))
    return out


@exercise("04.5", CHAPTER, "a communication hook that all-reduces every second step",
          "section 4 (communication hooks, the mean every rank gets) and section 5 (identical replicas)")
def check_every_second_step(attempt) -> str:
    if not isinstance(attempt, dict) or set(attempt) != {"state", "hook"}:
        raise Wrong("the attempt", '{"state": EverySecondStep, "hook": every_second_step_hook}', attempt,
                    "pass the state class and the hook function, as the check cell does")
    from .. import _data

    sizes = [p.numel() for p in _data.digits_mlp(seed=0).parameters()]
    steps = 10
    for world in (2, 3):
        per_rank = _launch.launch(_hook_on_ranks, world, args=(attempt["state"], attempt["hook"], steps), timeout=20)
        pattern = ""
        for step, (grad, mean, identical) in enumerate(per_rank[0]):
            case = f"world_size={world}, step {step} (2 buckets per backward after step 0)"
            fresh = torch.allclose(grad, mean, rtol=1e-5, atol=1e-7)
            reused = step > 0 and torch.equal(grad, per_rank[0][step - 1][0])
            if step == 0 and not fresh:
                raise Wrong(f"{case} (nothing to reuse yet): the gradient after backward()",
                            "the mean of the ranks' gradients", f"max |gradient - mean| {(grad - mean).abs().max():.3g}",
                            "a step that communicates must leave the average: the default all-reduce hook "
                            "already divides by the world size")
            if not identical:
                raise Wrong(f"{case}: the replicas after the step", "bit-identical on every rank", "different",
                            "on a step without communication every rank must apply the same gradient, and a "
                            "rank's own gradient differs from rank to rank")
            if not (fresh or reused):
                previous = per_rank[0][step - 1][0] if step else grad
                parts = list(zip(grad.split(sizes), mean.split(sizes), previous.split(sizes)))
                mixed = step > 0 and all(torch.allclose(g, m, rtol=1e-5, atol=1e-7) or torch.equal(g, p)
                                         for g, m, p in parts)
                if mixed:
                    raise Wrong(f"{case}: the gradient after backward()",
                                "this step's mean in every bucket, or the previous average in every bucket",
                                "some buckets all-reduced, others reused, in the same step",
                                "DDP calls the hook once per bucket, so a counter bumped on every call counts "
                                "buckets, not steps: bucket.is_last() marks a step's last bucket")
                raise Wrong(f"{case}: the gradient after backward()",
                            "this step's mean, or exactly the previous step's gradient",
                            f"neither (max |gradient - mean| {(grad - mean).abs().max():.3g})",
                            "reuse the last average for the same tensors in the same order: DDP rebuilds its "
                            "buckets after the first step")
            pattern += "S" if reused else "A"
        if "SS" in pattern or pattern.count("S") < (steps - 2) // 2:
            raise Wrong(f"world_size={world}, steps 0 to {steps - 1} (A: all-reduced, S: skipped)",
                        "about every second step skipped, never two in a row", pattern,
                        "count the steps in the hook's state: DDP calls the hook once per bucket, and "
                        "bucket.is_last() marks a step's last one")
    return (f"on 2 and 3 ranks, 10 steps with momentum and 2 buckets per backward: replicas bit-identical after "
            f"every step, every step applied its own mean or exactly the previous average, and "
            f"{pattern.count('S')} of {steps} steps skipped the all-reduce ({pattern}).")


# --------------------------------------------------------------------------- 04.6 bytes and times per step


def _reference_costs(per_rank_batch, repeats=3):
    import torch.distributed as dist
    import torch.nn.functional as F

    from .. import _data

    data = _data.load_digits()
    model = _data.digits_mlp(hidden=1024, depth=2, seed=0)
    x, y = data.x_train.repeat(2, 1)[:per_rank_batch], data.y_train.repeat(2)[:per_rank_batch]
    F.cross_entropy(model(x), y).backward()                           # warm-up
    compute = []
    for _ in range(repeats):
        start = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        compute.append(time.perf_counter() - start)
    grads = torch.zeros(sum(p.numel() for p in model.parameters()))
    dist.all_reduce(grads)                                            # warm-up
    comm = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(grads)
        comm.append(time.perf_counter() - start)
    return {"compute_ms": 1000 * min(compute), "all_reduce_ms": 1000 * min(comm)}


def _costs_on_ranks(step_costs, batches):
    out = []
    for batch in batches:
        got = step_costs(batch)
        out.append((dict(got) if isinstance(got, dict) else got, _reference_costs(batch)))
    return out


@exercise("04.6", CHAPTER, "bytes, compute and all-reduce time per step at two batch sizes",
          "section 4 (buckets) and the deeper notebook's honest-speed section")
def check_step_costs(step_costs) -> str:
    from .. import _data

    n_params = sum(p.numel() for p in _data.digits_mlp(hidden=1024, depth=2).parameters())
    batches = (16, 256)
    per_rank = _launch.launch(_costs_on_ranks, 2, args=(step_costs, batches), timeout=60)
    got = {batch: per_rank[0][k][0] for k, batch in enumerate(batches)}
    ref = {batch: per_rank[0][k][1] for k, batch in enumerate(batches)}
    keys = {"bytes", "compute_ms", "all_reduce_ms"}
    for batch in batches:
        if not isinstance(got[batch], dict) or not keys <= set(got[batch]):
            raise Wrong(f"per_rank_batch={batch}", f"a dict with the keys {sorted(keys)}", got[batch],
                        "return the three numbers in a dict")
    for batch in batches:
        if got[batch]["bytes"] != 4 * n_params:
            raise Wrong(f"per_rank_batch={batch} on 2 ranks: bytes all-reduced per step", 4 * n_params,
                        got[batch]["bytes"], "DDP all-reduces every float32 gradient once per step, whatever the "
                        "batch: count the bytes (numel() x element_size()) of one backward's buckets")
    for batch in batches:
        for key in ("compute_ms", "all_reduce_ms"):
            mine, theirs = float(got[batch][key]), ref[batch][key]
            if not theirs / 10 < mine < theirs * 10:
                raise Wrong(f"per_rank_batch={batch} on 2 ranks: {key}",
                            f"within 10 times of {theirs:.1f} ms, measured by the check just after yours",
                            f"{mine:.4g}", "time one forward and backward (or one all-reduce) in milliseconds, "
                            "and keep the fastest of a few repeats")
    ratio = got[256]["compute_ms"] / got[16]["compute_ms"]
    if ratio < 2:
        raise Wrong("compute_ms at per-rank batch 256 against 16", "more than 2 times longer", f"{ratio:.2f} times",
                    "time the forward and backward of the batch you were given, without DDP")
    return (f"on 2 ranks your step costs hold: {4 * n_params:,} bytes all-reduced per step at both batches, "
            "compute more than twice as long at 256 as at 16, times within 10 times of the check's own.")
