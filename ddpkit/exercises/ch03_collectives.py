"""Checks for chapter 03's exercises (``notebooks/03_collectives.ipynb``).

* 03.1 ``parcel_ring()``: ``pass_the_parcel`` made a full ring (the last rank sends the parcel back to rank
  0), on 1, 2 and 4 ranks, against the parcel each rank should hold (a hang gets the launcher's report);
* 03.3 ``all_gather_via_all_reduce(tensor)``: ``all_gather`` built from ``all_reduce`` only, on 1, 2 and 3
  ranks, for float and integer tensors of several shapes, twice in a row, against ``dist.all_gather``;
* 03.4 ``ring_all_average(tensor)``: the chapter's ring all-reduce made to average, with ``send``/``recv``
  only, on 1, 2, 3 and 4 ranks, for tensors shorter than the world and of lengths the world does not
  divide, against ``ReduceOp.AVG``.

Exercises 2, 5 and 6 ask what happens and why, or for a measurement: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import contextlib

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "03_collectives"


@contextlib.contextmanager
def _only(allowed, exercise_key):
    """Inside the block, the collectives and point-to-point calls not in ``allowed`` raise a RuntimeError."""
    import torch.distributed as dist

    names = ["all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "gather",
             "scatter", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
             "send", "recv", "isend", "irecv", "batch_isend_irecv"]
    saved = {name: getattr(dist, name) for name in names if name not in allowed and hasattr(dist, name)}

    def refuse(name):
        def refused(*args, **kwargs):
            raise RuntimeError(f"exercise {exercise_key} allows only {', '.join('dist.' + a for a in allowed)}; "
                               f"your code called dist.{name}")
        return refused

    for name in saved:
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


# --------------------------------------------------------------------------- 03.1


def _parcel_on_ranks(parcel_ring):
    import torch.distributed as dist

    if dist.get_world_size() == 1:      # nobody waits on a lone rank: report what it raised
        try:
            return [float(v) for v in parcel_ring()]
        except NotImplementedError:
            raise
        except Exception as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    return [float(v) for v in parcel_ring()]


@exercise("03.1", CHAPTER, "pass_the_parcel as a full ring", "section 1 (send and recv)")
def check_parcel_ring(parcel_ring) -> str:
    for world in (1, 2, 4):
        got = _launch.launch(_parcel_on_ranks, world, args=(parcel_ring,), timeout=20)
        expected = [[float(i + 1) if i <= rank or rank == 0 else 0.0 for i in range(world)] for rank in range(world)]
        if world == 1 and got != expected:
            raise Wrong("world_size=1: rank 0's parcel", expected[0], got[0],
                        "with one rank the ring is rank 0 alone: nothing to send, nobody to receive from")
        for rank in range(world):
            if got[rank] != expected[rank]:
                raise Wrong(f"world_size={world}: rank {rank}'s parcel"
                            + (" once it is back" if rank == 0 else " as it passed it on"),
                            expected[rank], got[rank],
                            "rank 0 marks and sends first, and receives the parcel back from the last rank")
    return ("on 1, 2 and 4 ranks the parcel went round the ring: every rank passed on its mark, and rank 0 got "
            "back [1, ..., n].")


# --------------------------------------------------------------------------- 03.3


def _gather_on_ranks(all_gather_via_all_reduce, cases):
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for shape, dtype in cases:
        g = torch.Generator().manual_seed(100 * rank + len(out))
        mine = torch.randint(-50, 50, shape, generator=g).to(dtype)
        reference = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(reference, mine)
        sent = mine.clone()
        with _only(["all_reduce"], "03.3"):
            got = all_gather_via_all_reduce(sent)
        out.append((reference, [t.clone() for t in got] if got is not None else None, torch.equal(sent, mine)))
    return out


def _describe(tensors):
    if tensors is None:
        return None
    return [f"{str(t.dtype).replace('torch.', '')} {list(t.shape)} {t.reshape(-1)[:4].tolist()}" for t in tensors]


@exercise("03.3", CHAPTER, "all_gather from all_reduce only", "section 2 (all_reduce and all_gather)")
def check_all_gather_via_all_reduce(all_gather_via_all_reduce) -> str:
    import torch

    cases = [((3,), torch.float32), ((2, 3), torch.int64), ((5,), torch.float64), ((2,), torch.float32)]
    for world in (1, 2, 3):
        got = _launch.launch(_gather_on_ranks, world, args=(all_gather_via_all_reduce, cases), timeout=20)
        for k, (shape, dtype) in enumerate(cases):
            for rank in range(world):
                reference, mine, untouched_input = got[rank][k]
                case = (f"world_size={world}, call {k + 1} of {len(cases)}: every rank's tensor of shape "
                        f"{list(shape)}, {dtype}; rank {rank}'s result")
                if mine is None or len(mine) != world:
                    raise Wrong(case, f"a list of {world} tensors", None if mine is None else f"{len(mine)} tensors",
                                "return one tensor per rank, in rank order")
                if not all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                           for a, b in zip(reference, mine)):
                    raise Wrong(case, _describe(reference), _describe(mine),
                                "every rank writes its tensor into its own slot (its rank) of zeros of its "
                                "dtype, and the sum fills every slot")
                if not untouched_input:
                    raise Wrong(case + ": the input tensor", "left as it was", "changed",
                                "all_reduce works in place: reduce a buffer of your own")
    return ("on 1, 2 and 3 ranks, four calls in a row (float32, int64 and float64; shapes [3], [2, 3], [5], [2]) "
            "returned exactly dist.all_gather's lists, using only dist.all_reduce.")


# --------------------------------------------------------------------------- 03.4


def _average_on_ranks(ring_all_average, lengths):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    out = []
    for numel in lengths:
        g = torch.Generator().manual_seed(10 * rank + numel)
        x = torch.randn(numel, generator=g)
        reference = x.clone()
        dist.all_reduce(reference, op=dist.ReduceOp.AVG)
        with _only(["send", "recv", "isend", "irecv"], "03.4"):
            got = ring_all_average(x.clone())
        out.append((reference, got.detach().clone() if isinstance(got, torch.Tensor) else got))
    return out


@exercise("03.4", CHAPTER, "the ring all-reduce, averaging", "section 4 (the ring all-reduce)")
def check_ring_all_average(ring_all_average) -> str:
    import torch

    lengths = {1: [3], 2: [1, 5], 3: [2, 7], 4: [10, 3]}
    for world, per_world in lengths.items():
        got = _launch.launch(_average_on_ranks, world, args=(ring_all_average, per_world), timeout=20)
        for k, numel in enumerate(per_world):
            for rank in range(world):
                reference, mine = got[rank][k]
                case = f"world_size={world}, {numel} element{'s' if numel > 1 else ''} per rank: rank {rank}'s result"
                if not isinstance(mine, torch.Tensor) or mine.shape != reference.shape:
                    raise Wrong(case, f"a tensor of shape {list(reference.shape)}",
                                f"{type(mine).__name__} {list(mine.shape) if isinstance(mine, torch.Tensor) else ''}",
                                "return the averaged tensor, as long as the input")
                if not torch.allclose(mine, reference, rtol=1e-5, atol=1e-6):
                    raise Wrong(case, [round(v, 4) for v in reference.tolist()], [round(v, 4) for v in mine.tolist()],
                                "the ring sums every chunk once; divide that sum by the world size once")
    return ("on 1, 2, 3 and 4 ranks, for 1 to 10 elements (fewer than the ranks, and lengths the world does not "
            "divide), your ring with send/recv matched ReduceOp.AVG on every rank (within 1e-5).")
