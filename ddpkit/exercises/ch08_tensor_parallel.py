"""Checks for chapter 08's exercises (``notebooks/08_tensor_parallel.ipynb``).

* 08.1 ``attend_f_each(attn, x, f)``: attention before its output projection with one Megatron ``f``
  inside each of ``wq``, ``wk`` and ``wv``, put into the chapter's hand-written block on 2 and 4 ranks:
  output and every gradient equal to one process, and ``CommDebugMode`` counting the plain
  ``ColwiseParallel`` plan's 2 all-reduces forward and 4 backward;
* 08.2 ``bytes_per_step(world_size, tokens)``: the bytes each rank sends per step for the block under
  tensor parallelism and under data parallelism, against the chapter's ring counting them on 1, 2 and
  4 real ranks, at 1, 32 and 100 tokens per step;
* 08.3 ``believed_shape(shape, dim, world_size, rank)``: the global shape ``DTensor.from_local(local,
  mesh, [Shard(dim)])`` believes in without ``shape=``, against real ranks' ``from_local`` on 3 and 4
  ranks (even and uneven shards, empty ones included).

Exercise 4 asks for an explanation: the chapter offers a self-check (:func:`ddpkit.exercises.reveal`).
The workers below rebuild the chapter's hand-written block (``f``, ``g``, the ring, the split MLP and
attention, sections 1 to 3) at its sizes.
"""

from __future__ import annotations

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "08_tensor_parallel"
D, HEADS, HIDDEN = 32, 4, 128
RTOL = 1e-5


# --------------------------------------------------------------------------- the chapter's block, on ranks


def _ring_all_reduce(tensor):
    """The chapter's ring (section 2): sums ``tensor`` in place, returns the bytes this rank sent."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    chunks, sent = list(tensor.view(-1).tensor_split(n)), 0
    for step in range(2 * (n - 1)):
        outgoing, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        buffer = torch.empty_like(incoming)
        for request in (dist.isend(outgoing, (rank + 1) % n), dist.irecv(buffer, (rank - 1) % n)):
            request.wait()
        sent += outgoing.numel() * outgoing.element_size()
        if step < n - 1:
            incoming += buffer
        else:
            incoming.copy_(buffer)
    return sent


def _pieces():
    """The chapter's classes, built inside a rank (sections 1 to 3)."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    class AllReduce:
        def __init__(self, ring=False):
            self.ring, self.sent = ring, 0

        def __call__(self, tensor):
            tensor = tensor.clone(memory_format=torch.contiguous_format)
            if self.ring:
                self.sent += _ring_all_reduce(tensor)
            else:
                dist.all_reduce(tensor)
            return tensor

    class CopyToRanks(torch.autograd.Function):          # f
        @staticmethod
        def forward(ctx, x, all_reduce):
            ctx.all_reduce = all_reduce
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return ctx.all_reduce(grad), None

    class ReduceFromRanks(torch.autograd.Function):      # g
        @staticmethod
        def forward(ctx, x, all_reduce):
            return all_reduce(x)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    def shard_linear(full, dim):
        rank, n = dist.get_rank(), dist.get_world_size()
        part = copy.deepcopy(full)
        part.weight = nn.Parameter(full.weight.detach().chunk(n, dim)[rank].clone())
        if dim == 0:
            part.bias = nn.Parameter(full.bias.detach().chunk(n)[rank].clone())
        return part

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    class ParallelMLP(nn.Module):
        def __init__(self, mlp, all_reduce):
            super().__init__()
            self.all_reduce = all_reduce
            self.w1, self.w2 = shard_linear(mlp.w1, 0), shard_linear(mlp.w2, 1)

        def forward(self, x):
            x = CopyToRanks.apply(x, self.all_reduce)
            partial = F.linear(F.gelu(self.w1(x)), self.w2.weight)
            return ReduceFromRanks.apply(partial, self.all_reduce) + self.w2.bias

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = D // HEADS
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D) for _ in range(4))

        def attend(self, x):
            B, T, _ = x.shape
            q, k, v = (w(x).view(B, T, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)

        def forward(self, x):
            return self.wo(self.attend(x))

    class ParallelAttention(nn.Module):
        """Section 3's split attention; ``attend(self, x, f)`` is the chapter's, or the learner's."""

        def __init__(self, attn, all_reduce, attend=None):
            super().__init__()
            self.head_dim, self.all_reduce, self.attend_with = attn.head_dim, all_reduce, attend
            self.wq, self.wk, self.wv = (shard_linear(w, 0) for w in (attn.wq, attn.wk, attn.wv))
            self.wo = shard_linear(attn.wo, 1)

        def forward(self, x):
            def f(t):
                return CopyToRanks.apply(t, self.all_reduce)

            if self.attend_with is None:                 # the chapter's: one f for the three projections
                attended = Attention.attend(self, f(x))
            else:
                attended = self.attend_with(self, x, f)
            partial = F.linear(attended, self.wo.weight)
            return ReduceFromRanks.apply(partial, self.all_reduce) + self.wo.bias

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), MLP()

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    def make_block():
        torch.manual_seed(0)
        return Block()

    def parallelize(block, all_reduce, attend=None):
        block.attn = ParallelAttention(block.attn, all_reduce, attend)
        block.mlp = ParallelMLP(block.mlp, all_reduce)
        return block

    return AllReduce, make_block, parallelize


def _batch(batch, tokens):
    import torch

    x = torch.randn(batch, tokens, D, generator=torch.Generator().manual_seed(1))
    return x, torch.randn(batch, tokens, D, generator=torch.Generator().manual_seed(2))


def _step(model, x, target):
    import torch.nn.functional as F

    x = x.clone().requires_grad_()
    y = model(x)
    F.mse_loss(y, target).backward()
    return {"output": y.detach(), "input grad": x.grad, **{n: p.grad for n, p in model.named_parameters()}}


# --------------------------------------------------------------------------- 08.1 one f per projection

_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "wo": 1, "w2": 1}


def _f_each_on_ranks(attend_f_each):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.debug import CommDebugMode

    from .._train import relative_gaps

    rank, n = dist.get_rank(), dist.get_world_size()
    AllReduce, make_block, parallelize = _pieces()
    x, target = _batch(4, 8)
    reference = _step(make_block(), x, target)
    block = parallelize(make_block(), AllReduce(), attend_f_each)
    x = x.clone().requires_grad_()
    with CommDebugMode() as forward:
        y = block(x)
    with CommDebugMode() as backward:
        F.mse_loss(y, target).backward()
    found = {"output": y.detach(), "input grad": x.grad, **{k: p.grad for k, p in block.named_parameters()}}
    mine = {}                                          # this rank's slice of the one-process tensors
    for name, ref in reference.items():
        layer, _, kind = name.rpartition(".")
        dim = _SPLIT.get(layer.split(".")[-1])
        mine[name] = ref.chunk(n, dim)[rank] if dim == 0 or (dim == 1 and kind == "weight") else ref
    if found.keys() != mine.keys() or any(found[k] is None or found[k].shape != mine[k].shape for k in mine):
        shapes = {k: None if v is None else tuple(v.shape) for k, v in found.items()}
        return {"shapes": shapes}, None, None
    counts = [sum(c for op, c in mode.get_comm_counts().items() if "all_reduce" in str(op) or "allreduce" in str(op))
              for mode in (forward, backward)]
    return relative_gaps(found, mine), counts[0], counts[1]


@exercise("08.1", CHAPTER, "one f inside each of wq, wk and wv",
          "section 1 (f and g), section 3 (attention) and section 6 (the colwise/rowwise plan)")
def check_attend_f_each(attend_f_each) -> str:
    for world in (2, 4):
        per_rank = _launch.launch(_f_each_on_ranks, world, args=(attend_f_each,), timeout=20)
        for rank, (gaps, forward, backward) in enumerate(per_rank):
            if "shapes" in gaps:
                raise Wrong(f"world_size={world}, rank {rank}: the block's gradients", "a gradient for every "
                            "parameter, shaped like this rank's slice", gaps["shapes"],
                            "use attn.wq, attn.wk and attn.wv (this rank's slices) and return the heads attended")
            worst = max(gaps, key=gaps.get)
            if gaps[worst] > RTOL:
                raise Wrong(f"world_size={world}, rank {rank}: {worst} against one process",
                            f"a relative gap at most {RTOL:g}", f"{gaps[worst]:.2g}",
                            "x fed every rank's heads, so its gradient must be summed over the ranks: f's backward")
        forward, backward = per_rank[0][1], per_rank[0][2]
        if (forward, backward) != (2, 4):
            raise Wrong(f"world_size={world}: all-reduces counted by CommDebugMode in one step",
                        {"forward": 2, "backward": 4}, {"forward": forward, "backward": backward},
                        "each projection's input passes through its own f, the way each ColwiseParallel layer "
                        "wraps its own input")
    return ("on 2 and 4 ranks the block with your attention equals one process (every gap under 1e-5) and "
            "all-reduces 2 times forward and 4 backward, the colwise/rowwise plan's count: two more than one f "
            "per sublayer, for the same gradient.")


# --------------------------------------------------------------------------- 08.2 bytes per step

_TOKENS = [(1, 1), (4, 8), (4, 25)]               # (sequences, tokens each): 1, 32 and 100 tokens per step


def _traffic_on_ranks():
    import torch

    AllReduce, make_block, parallelize = _pieces()
    tensor_parallel = []
    for batch, tokens in _TOKENS:
        ring = AllReduce(ring=True)
        _step(parallelize(make_block(), ring), *_batch(batch, tokens))
        tensor_parallel.append(ring.sent)
    block = make_block()
    _step(block, *_batch(4, 8))
    data_parallel = _ring_all_reduce(torch.cat([p.grad.flatten() for p in block.parameters()]))
    return tensor_parallel, data_parallel


@exercise("08.2", CHAPTER, "bytes per step: tensor parallelism against data parallelism",
          "section 2 (bytes per step) and section 3 (a whole block)")
def check_bytes_per_step(bytes_per_step) -> str:
    for world in (1, 2, 4):
        tensor_parallel, data_parallel = _launch.launch(_traffic_on_ranks, world, timeout=20)[0]
        for (batch, tokens), tp in zip(_TOKENS, tensor_parallel):
            got = bytes_per_step(world, batch * tokens)
            try:
                got_tp, got_dp = (float(v) for v in got)
            except (TypeError, ValueError):
                raise Wrong(f"world_size={world}, tokens={batch * tokens}", (tp, data_parallel), got,
                            "return two numbers: (tensor parallel bytes, data parallel bytes)") from None
            case = f"world_size={world}, tokens={batch * tokens} ({batch} x {tokens})"
            if world == 1 and (got_tp, got_dp) != (0, 0):
                raise Wrong(case, (tp, data_parallel), got, "with one rank a ring sends nothing")
            if abs(got_tp - tp) > 0.5:
                raise Wrong(f"{case}: tensor parallelism", tp, got[0],
                            "a block has two sublayers, each all-reducing its activations in f and in g")
            if abs(got_dp - data_parallel) > 0.5:
                raise Wrong(f"{case}: data parallelism", data_parallel, got[1],
                            "data parallelism all-reduces the gradient of every parameter of the whole block "
                            "(both sublayers and the norms) once per step, whatever the tokens")
    return ("your bytes equal what the chapter's ring sent on 1, 2 and 4 real ranks at 1, 32 and 100 tokens per "
            "step, for tensor and for data parallelism; now set them equal to find where they cross.")


# --------------------------------------------------------------------------- 08.3 from_local without shape=

_SHAPES = {3: [((6, 3), 0), ((5, 3), 0), ((4, 4), 1)], 4: [((4, 8), 1), ((4, 6), 1), ((2, 3), 0), ((5, 3), 0)]}


def _from_local_on_ranks(cases):
    import logging

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    for name in ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor._redistribute"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch.distributed as dist

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = []
    for shape, dim in cases:
        local = distribute_tensor(torch.zeros(shape), mesh, [Shard(dim)]).to_local()
        out.append(tuple(DTensor.from_local(local, mesh, [Shard(dim)]).shape))
    return out


@exercise("08.3", CHAPTER, "the global shape from_local believes in without shape=",
          "section 4 (DTensor.from_local and torch.chunk's pieces)")
def check_believed_shape(believed_shape) -> str:
    checked = 0
    for world, cases in _SHAPES.items():
        per_rank = _launch.launch(_from_local_on_ranks, world, args=(cases,), timeout=20)
        for k, (shape, dim) in enumerate(cases):
            for rank in range(world):
                expected = per_rank[rank][k]
                got = believed_shape(shape, dim, world, rank)
                try:
                    same = tuple(int(s) for s in got) == expected
                except (TypeError, ValueError):
                    same = False
                if not same:
                    hint = ("from_local does not communicate: it knows only this rank's own piece (a torch.chunk "
                            "piece, possibly smaller or empty) and the mesh size")
                    raise Wrong(f"shape={shape}, Shard({dim}), world_size={world}, rank {rank}", expected, got, hint)
                checked += 1
    return (f"your shapes equal what from_local believed on real ranks in all {checked} cases (3 and 4 ranks, "
            "even, uneven and empty shards): with uneven shards the ranks disagree about the global shape, so a "
            "collective planned from it may hang or go wrong.")
