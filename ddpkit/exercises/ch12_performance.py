"""Checks for chapter 12's exercises (``notebooks/12_performance.ipynb``).

* 12.1 ``fit_ring(nbytes, seconds, n)``: section 1's fit of ``alpha`` and ``beta`` at any world size, on exact
  ring times at 2, 3, 4 and 8 ranks, then on ``all_reduce`` times measured on 2 real ranks in the check,
  against the chapter's fit of the same rows;
* 12.2 ``overlap(spans)``: the share of one step's all-reduce time inside the backward window, and the tail
  after it, on hand-made steps (an all-reduce straddling the window's end, one wholly after it, two
  backward runs) and on the steps 2 real ranks profiled under DDP, against the chapter's ``step_overlap``;
* 12.4 ``ddp_bucket_bytes(grad_bytes, cap)``: DDP's buckets for gradients of these sizes, against DDP's own
  assignment for section 5's model at 6 caps and against the buckets real DDP built on 2 ranks.

Exercise 3 (``OMP_WAIT_POLICY``) is a measurement to explain: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`).
"""

from __future__ import annotations

import math

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "12_performance"
MiB = 1 << 20


# --------------------------------------------------------------------------- 12.1


def _ring_time(nbytes, n, alpha, beta):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def _reference_fit(nbytes, seconds, n):
    """The chapter's fit_ring: least squares on the relative error."""
    import numpy as np

    S, t = np.array(nbytes, dtype=float), np.array(seconds, dtype=float)
    design = np.stack([np.full_like(S, 2 * (n - 1)), 2 * (n - 1) / n * S], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


@exercise("12.1", CHAPTER, "alpha and beta of a ring all-reduce at any world size",
          "section 1 (the ring model and its fit)")
def check_fit_ring(fit_ring) -> str:
    from .. import _bench

    sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, MiB, 4 * MiB]
    for n, alpha, beta in ((2, 50e-6, 1e-9), (3, 50e-6, 1e-9), (4, 200e-6, 0.25e-9), (8, 10e-6, 2e-9)):
        seconds = [_ring_time(s, n, alpha, beta) for s in sizes]
        got = tuple(float(v) for v in fit_ring(list(sizes), seconds, n))
        if len(got) != 2 or not all(math.isclose(g, e, rel_tol=0.01) for g, e in zip(got, (alpha, beta))):
            raise Wrong(f"exact ring times T(S, {n}) at {len(sizes)} sizes, alpha={alpha:.0e} s, beta={beta:.0e} s/B",
                        (alpha, beta), got, "the ring makes 2(n-1) steps and each rank sends 2(n-1)/n x S bytes: "
                        "both depend on n")
    rows = _bench.collective_bandwidth("all_reduce", world_sizes=(2,), sizes=sizes, repeats=3, statistic="min")
    nbytes, seconds = [r.nbytes for r in rows], [r.seconds for r in rows]
    ref = _reference_fit(nbytes, seconds, 2)
    got = tuple(float(v) for v in fit_ring(list(nbytes), list(seconds), 2))
    predicted = {s: (_ring_time(s, 2, *got), _ring_time(s, 2, *ref)) for s in nbytes}
    off = {s: g / r for s, (g, r) in predicted.items() if not 0.5 <= g / r <= 2}
    if off:
        s = min(off)
        raise Wrong(f"all_reduce measured on 2 ranks just now, {len(nbytes)} sizes: the prediction at {s:,} bytes",
                    f"{predicted[s][1] * 1e6:.0f} us (least squares on the relative error), within 2x",
                    f"{predicted[s][0] * 1e6:.0f} us", "small sizes take microseconds, large ones milliseconds: "
                    "fit the relative error, so that every size counts")
    return ("your fit recovered alpha and beta from exact ring times at 2, 3, 4 and 8 ranks, and on all_reduce "
            "times measured on 2 ranks predicted every size within 2x of the chapter's fit.")


# --------------------------------------------------------------------------- 12.2


def _reference_overlap(spans):
    backward = [s for s in spans if s.kind == "backward"]
    b0, b1 = min(s.start for s in backward), max(s.end for s in backward)
    comm = [s for s in spans if s.kind == "all-reduce"]
    inside = sum(max(0.0, min(s.end, b1) - max(s.start, b0)) for s in comm)
    return inside / sum(s.seconds for s in comm), max(s.end for s in spans) - b1


def _profiled_steps(depth, hidden, bucket_cap_mb, steps=2):
    """In a rank: the chapter's profiled DDP steps (section 2), as lists of Spans, one list per step."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    from .. import _data
    from .._timeline import Span

    kinds = {"DistributedDataParallel.forward": "forward", "Optimizer.step#SGD.step": "optimizer",
             "gloo:all_reduce": "all-reduce"}

    def kind_of(name):
        return "backward" if name.startswith("autograd::engine::evaluate_function: ") else kinds.get(name)

    rank, data = dist.get_rank(), _data.load_digits()
    x, y = data.x_train[rank * 32:(rank + 1) * 32], data.y_train[rank * 32:(rank + 1) * 32]
    model = DDP(_data.digits_mlp(hidden=hidden, depth=depth, seed=0), bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with record_function(f"step {i}"):
                step()
    events = [(e.name, e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()]
    marks = sorted((start, end) for name, start, end in events if name.startswith("step "))
    spans = sorted((Span(kind_of(name), name, start, end) for name, start, end in events if kind_of(name)),
                   key=lambda s: s.start)
    return [[s for s in spans if start <= s.start < end] for start, end in marks]


@exercise("12.2", CHAPTER, "how much of the all-reduce time the backward pass hides",
          "section 2 (when DDP communicates)")
def check_overlap(overlap) -> str:
    from .._timeline import Span

    def step(*spans):
        return [Span(kind, kind, start, end) for kind, start, end in spans]

    cases = {
        "one all-reduce inside the backward window": step(("forward", 0, 1), ("backward", 1, 3), ("all-reduce", 1.5, 2),
                                                          ("optimizer", 3, 3.5)),
        "an all-reduce straddling the window's end": step(("forward", 0, 1), ("backward", 1, 3),
                                                          ("all-reduce", 2, 4), ("optimizer", 4, 4.5)),
        "two backward functions, one all-reduce wholly after them": step(
            ("forward", 0, 1), ("backward", 1, 2), ("all-reduce", 1.5, 2.5), ("backward", 2.5, 3),
            ("all-reduce", 3.5, 4.5), ("optimizer", 4.5, 5)),
    }
    for label, spans in cases.items():
        expected = _reference_overlap(spans)
        got = tuple(float(v) for v in overlap(list(spans)))
        if len(got) != 2 or not all(math.isclose(g, e, rel_tol=1e-9, abs_tol=1e-12) for g, e in zip(got, expected)):
            raise Wrong(f"{label}: {[(s.kind, s.start, s.end) for s in spans]}", expected, got,
                        "the window runs from the first backward function's start to the last one's end; count only "
                        "the part of each all-reduce that lies inside it, over all the all-reduce time")
    per_rank = _launch.launch(_profiled_steps, 2, args=(4, 256, 1), timeout=60,
                             env={"KINETO_LOG_LEVEL": "6"})
    checked = 0
    for rank, steps in enumerate(per_rank):
        for i, spans in enumerate(steps):
            expected = _reference_overlap(spans)
            got = tuple(float(v) for v in overlap(list(spans)))
            if not all(math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-9) for g, e in zip(got, expected)):
                raise Wrong(f"rank {rank}, profiled step {i} of DDP with bucket_cap_mb=1 "
                            f"({sum(s.kind == 'all-reduce' for s in spans)} all-reduces)", expected, got,
                            "the window runs from the first backward function's start to the last one's end")
            checked += 1
    return (f"your (share inside, tail) equal the chapter's step_overlap on 3 hand-made steps and on the {checked} "
            "steps 2 ranks profiled under DDP with bucket_cap_mb=1.")


# --------------------------------------------------------------------------- 12.4


def _assignment(grad_bytes, cap):
    """DDP's own assignment (private), on bfloat16 "meta" tensors of these byte sizes."""
    import torch
    import torch.distributed as dist

    grads = [torch.empty(b // 2, dtype=torch.bfloat16, device="meta") for b in grad_bytes]
    buckets, _ = dist._compute_bucket_assignment_by_size(grads, [cap], [False] * len(grads))
    return [sum(grad_bytes[i] for i in bucket) for bucket in buckets]


def _big_grads(blocks, w=4096):
    shapes = [(w,), (w, w), (w, w), (w, w), (w, w), (w,), (4 * w, w), (w, 4 * w)]
    return [2 * math.prod(s) for _ in range(blocks) for s in shapes][::-1]


def _real_buckets(caps, hidden, depth):
    """In a rank: the buckets real DDP rebuilt after its first step, per cap, and the gradient bytes in order."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .. import _data

    data, out = _data.load_digits(), {}
    for cap in caps:
        model = DDP(_data.digits_mlp(hidden=hidden, depth=depth, seed=0), bucket_cap_mb=cap)
        for _ in range(3):                 # DDP rebuilds its buckets at the second step's forward
            model.zero_grad()
            F.cross_entropy(model(data.x_train[:16]), data.y_train[:16]).backward()
        out[cap] = [int(b) for b in model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
    grads = [p.numel() * p.element_size() for p in model.parameters()][::-1]
    dist.barrier()
    return out, grads


@exercise("12.4", CHAPTER, "DDP's buckets for a given bucket_cap_mb", "section 5 (DDP's buckets)")
def check_ddp_bucket_bytes(ddp_bucket_bytes) -> str:
    cases = [("2 gradients of 3 MiB and 1 MiB, cap 2 MiB", [3 * MiB, MiB], 2 * MiB),
             ("4 gradients of 1 MiB, cap 2 MiB", [MiB] * 4, 2 * MiB)]
    cases += [(f"section 5's model, {blocks} block(s), bucket_cap_mb={cap}", _big_grads(blocks), cap * MiB)
              for blocks in (1, 32) for cap in (1, 25, 33, 64, 300)]
    for label, grads, cap in cases:
        expected = _assignment(grads, cap)
        got = [int(b) for b in ddp_bucket_bytes(list(grads), cap)]
        if got != expected:
            raise Wrong(f"{label}: {len(grads)} gradients, {sum(grads) / MiB:g} MiB", expected if len(expected) < 12
                        else f"{len(expected)} buckets: {expected[:3]} ...", got if len(got) < 12 else
                        f"{len(got)} buckets: {got[:3]} ...", "DDP never splits a gradient: it adds whole gradients "
                        "to a bucket, in order, until the bucket reaches the cap")
    caps = (1, 4)
    (real, grads), _ = _launch.launch(_real_buckets, 2, args=(caps, 512, 8), timeout=40)
    for cap in caps:
        got = [int(b) for b in ddp_bucket_bytes(list(grads), cap * MiB)]
        if got != real[cap]:
            raise Wrong(f"the digits MLP (8 layers of 512) under real DDP on 2 ranks, bucket_cap_mb={cap}", real[cap],
                        got, "DDP never splits a gradient: it adds whole gradients to a bucket, in order, until the "
                        "bucket reaches the cap")
    return (f"your buckets equal DDP's own assignment in all {len(cases)} cases (section 5's model, 1 and 32 blocks, "
            "5 caps) and the buckets real DDP built on 2 ranks at bucket_cap_mb 1 and 4.")
