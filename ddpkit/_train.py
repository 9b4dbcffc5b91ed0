"""Three measurements every data-parallel experiment needs, done carefully.

*Did the ranks compute the same thing as one process?* :func:`max_abs_diff`
compares two models (or state dicts) parameter by parameter, and ignores the
``module.`` prefix that ``DistributedDataParallel`` adds to every key, so a
DDP model can be compared with a plain one directly.

*What is the accuracy, exactly?* :func:`exact_accuracy` evaluates a model
with the test set sharded across the ranks *without padding* (rank ``r``
takes samples ``r, r + N, r + 2N, ...``) and sums the integer counts with one
``all_reduce``. Every sample is counted exactly once, so the result equals
the single-process accuracy to the last digit; a ``DistributedSampler`` would
pad the shards with duplicates instead (chapter 05 shows the skew).

*How fast is it, honestly?* :func:`measure_throughput` times real training
steps between two barriers and reports samples per second for the whole
group, using the slowest rank's time (a step is only done when every rank is
done).

Each works in a plain process and inside :func:`ddpkit.launch` alike.

>>> import torch
>>> m = torch.nn.Linear(2, 2)
>>> shifted = {"module." + k: v + 0.25 for k, v in m.state_dict().items()}   # keys as DDP names them
>>> round(max_abs_diff(m, shifted), 6)
0.25
"""

from __future__ import annotations

import time
from typing import Any, Mapping, NamedTuple


def _group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _state(obj: Any) -> Mapping[str, Any]:
    sd = obj.state_dict() if hasattr(obj, "state_dict") else obj
    return {k.removeprefix("module."): v for k, v in sd.items()}


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest absolute difference between two models' parameters and buffers.

    ``a`` and ``b`` are modules (plain or DDP-wrapped) or state dicts; the
    ``module.`` prefix DDP adds is ignored. They must have the same keys and
    shapes. ``0.0`` means bit-identical.

    >>> import torch
    >>> a, b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    >>> with torch.no_grad():
    ...     _ = b.weight.copy_(a.weight), b.bias.copy_(a.bias + 1e-3)
    >>> round(max_abs_diff(a, b), 6)
    0.001
    """
    sa, sb = _state(a), _state(b)
    if sa.keys() != sb.keys():
        raise ValueError(f"different entries: only in a {sorted(sa.keys() - sb.keys())}, only in b {sorted(sb.keys() - sa.keys())}")
    worst = 0.0
    for k, va in sa.items():
        vb = sb[k]
        if va.shape != vb.shape:
            raise ValueError(f"{k}: shape {tuple(va.shape)} vs {tuple(vb.shape)}")
        if va.numel():
            worst = max(worst, (va.detach().double() - vb.detach().double()).abs().max().item())
    return worst


class Score(NamedTuple):
    """How many of ``total`` samples a model classified correctly."""

    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


def exact_accuracy(model: Any, x: Any, y: Any, batch_size: int = 512) -> Score:
    """Classification accuracy of ``model`` on ``(x, y)``, computed by all ranks together, exactly.

    Rank ``r`` of ``N`` evaluates samples ``r, r + N, r + 2N, ...`` (no padding,
    no duplicates), and one ``all_reduce(SUM)`` of the integer counts gives
    every rank the same :class:`Score`. Outside a process group it simply
    evaluates everything. A DDP-wrapped model is unwrapped first (its forward
    may run collectives that ranks with unequal shards would not match), run
    in ``eval()`` mode under ``no_grad``, and put back in the mode it was in.

    >>> import torch, ddpkit
    >>> _ = torch.manual_seed(0); x = torch.randn(7, 4); y = torch.randint(0, 3, (7,))
    >>> model = torch.nn.Linear(4, 3)
    >>> one = exact_accuracy(model, x, y)
    >>> one.total
    7
    >>> ddpkit.launch(lambda: exact_accuracy(model, x, y) == one, world_size=3)
    [True, True, True]
    """
    import torch

    rank, world = _group()
    net = getattr(model, "module", model)
    was_training = net.training
    net.eval()
    correct = 0
    try:
        with torch.no_grad():
            idx = torch.arange(rank, len(x), world)
            for start in range(0, len(idx), batch_size):
                part = idx[start : start + batch_size]
                correct += int((net(x[part]).argmax(dim=1) == y[part]).sum())
    finally:
        net.train(was_training)
    counts = torch.tensor([correct, len(idx)], dtype=torch.int64, device=y.device)  # NCCL reduces GPU tensors only
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(counts)
    return Score(int(counts[0]), int(counts[1]))


def measure_throughput(model: Any, x: Any, y: Any, batch_size: int, steps: int = 20, warmup: int = 3, lr: float = 0.01) -> float:
    """Training samples per second of the whole group: ``steps`` SGD steps of ``batch_size`` per rank.

    ``model`` is what you would train (plain, or DDP-wrapped inside a rank);
    batches are taken in turn from ``x, y``; ``warmup`` untimed steps come
    first (first-call costs, DDP's bucket rebuild). The clock runs from a
    barrier to a barrier, and the slowest rank's time counts:
    ``world_size * batch_size * steps / seconds``. The model is trained for
    real: pass a copy if you still need the original.

    >>> import torch, ddpkit
    >>> x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    >>> rate = measure_throughput(torch.nn.Linear(8, 2), x, y, batch_size=16, steps=5)
    >>> rate > 0
    True
    """
    import torch
    import torch.nn.functional as F

    rank, world = _group()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = len(x)

    def step(i: int) -> None:
        start = (i * batch_size) % max(1, n - batch_size + 1)
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        opt.step()

    def sync() -> None:
        if world > 1:
            import torch.distributed as dist

            dist.barrier()

    for i in range(warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    sync()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return world * batch_size * steps / float(elapsed)


def relative_gaps(found: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, float]:
    """How far each tensor in ``found`` is from ``reference``, relative to its layer's size.

    For each name: ``max |found - reference|`` divided by the largest
    ``|reference|`` value of its *layer*, the entries whose names share
    everything before the last ``.`` (``"mlp.w1.weight"`` and ``"mlp.w1.bias"``
    are the layer ``"mlp.w1"``; a name without a ``.`` is a layer of its own).
    A computation split over ranks adds its sums in another order than one
    process, so in ``float32`` the results differ in their last digits,
    relative to their size (gaps near ``1e-7``), while a wrong split differs by
    about the values themselves (gaps near 1). A fixed absolute tolerance would
    fail large values or miss errors in small ones (gradients are often far
    smaller than activations). Scaling by the layer rather than the entry
    keeps a value that is zero in exact arithmetic, pure rounding noise, from
    failing. A layer whose reference is all zeros gives 0 where ``found``
    agrees exactly and ``inf`` where it does not.

    Both mappings need the same names and shapes, plain tensors (turn a
    ``DTensor`` into one with ``full_tensor()`` first).

    >>> import torch
    >>> reference = {"w.weight": torch.tensor([2.0, -4.0]), "w.bias": torch.tensor([0.0]), "out": torch.tensor([8.0])}
    >>> found = {"w.weight": torch.tensor([2.0, -4.4]), "w.bias": torch.tensor([0.2]), "out": torch.tensor([8.0])}
    >>> {name: round(gap, 3) for name, gap in relative_gaps(found, reference).items()}
    {'w.weight': 0.1, 'w.bias': 0.05, 'out': 0.0}
    """
    if found.keys() != reference.keys():
        raise ValueError(f"different entries: only in found {sorted(found.keys() - reference.keys())}, "
                         f"only in reference {sorted(reference.keys() - found.keys())}")
    scale: dict[str, float] = {}
    for name, ref in reference.items():
        layer = name.rpartition(".")[0] or name
        size = ref.detach().double().abs().max().item() if ref.numel() else 0.0
        scale[layer] = max(scale.get(layer, 0.0), size)
    gaps = {}
    for name, ref in reference.items():
        if tuple(found[name].shape) != tuple(ref.shape):
            raise ValueError(f"{name}: shape {tuple(found[name].shape)} vs {tuple(ref.shape)}")
        gap = (found[name].detach().double() - ref.detach().double()).abs().max().item() if ref.numel() else 0.0
        layer_scale = scale[name.rpartition(".")[0] or name]
        gaps[name] = gap / layer_scale if layer_scale else (0.0 if gap == 0 else float("inf"))
    return gaps
