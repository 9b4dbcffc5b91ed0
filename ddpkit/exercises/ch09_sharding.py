"""Checks for chapter 09's exercises (``notebooks/09_sharding.ipynb``).

* 09.1 ``zero2_step(opt)``: ZeRO-2's gradient sharding, done after the backward: the step of the chapter's
  ``Zero1`` that frees the whole gradients once they are reduce-scattered, run on 2 and 3 ranks (3: a padded
  flat vector) for 3 steps: Adam gets one process's averaged gradient for the rank's part, no whole gradient
  is left after ``step()``, and the parameters end where ``Zero1``'s do;
* 09.3 ``crossing_tokens(world_size, strategy)``: from how many tokens per rank on a rank's activations
  outweigh its parameters, gradients and Adam state, under DDP and FSDP2, against both sides measured on
  1, 2 and 4 real ranks;
* 09.4 ``one_file_state(checkpoint_dir, path)``: a DCP checkpoint saved by 1 and by 3 FSDP2 ranks (3:
  uneven shards) turned into one ``torch.save`` file, compared with the saved state to the bit.

Exercise 2 asks for a measurement and an explanation: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for it. The workers below rebuild the chapter's model, data and
``Zero1`` (sections 1 and 2) at its sizes.
"""

from __future__ import annotations

import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "09_sharding"
VOCAB, D, HIDDEN, BLOCKS = 512, 32, 128, 2
BATCH, TOKENS, STEPS, LR = 8, 16, 3, 1e-2
TOL, GRAD_RTOL = 1e-2, 1e-5          # the chapter's "trains like" and "same gradient" (section 2)


# --------------------------------------------------------------------------- the chapter's pieces


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.w1, self.w2 = nn.LayerNorm(D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens.flatten())
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model():
    torch.manual_seed(0)
    return TinyLM()


def _data():
    return torch.randint(VOCAB, (STEPS, BATCH, TOKENS + 1), generator=torch.Generator().manual_seed(1))


def loss_on(model, step, rank=0, n=1):
    sequences = _data()[step].chunk(n)[rank]
    return F.cross_entropy(model(sequences[:, :-1].clone()), sequences[:, 1:].clone().flatten())


class Zero1:
    """The chapter's ZeRO-1 (section 2): Adam's state for 1/n of the flattened parameters on each rank."""

    def __init__(self, params, lr):
        import torch.distributed as dist

        self.params, self.rank, self.n = list(params), dist.get_rank(), dist.get_world_size()
        total = sum(p.numel() for p in self.params)
        self.size = math.ceil(total / self.n)
        self.pad = self.size * self.n - total
        mine = self.flat([p.detach() for p in self.params])[self.rank * self.size:(self.rank + 1) * self.size]
        self.shard = nn.Parameter(mine.clone())
        self.optim = torch.optim.Adam([self.shard], lr=lr)

    def flat(self, tensors):
        return torch.cat([t.flatten() for t in tensors] + [torch.zeros(self.pad)])

    def step(self):
        import torch.distributed as dist

        grad = torch.empty(self.size)
        dist.reduce_scatter_single(grad, self.flat([p.grad for p in self.params]))
        self.shard.grad = self.last_grad = grad / self.n
        self.optim.step()
        self.shard.grad = None
        everything = torch.empty(self.size * self.n)
        dist.all_gather_single(everything, self.shard.detach())
        with torch.no_grad():
            for p, value in zip(self.params, everything.split([p.numel() for p in self.params] + [self.pad])):
                p.copy_(value.view_as(p))                           # the padding, last, is dropped by zip

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def _nbytes(tensor):
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _held(model, opt):
    return (sum(_nbytes(p) for p in model.parameters())
            + sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None)
            + sum(_nbytes(v) for state in opt.state.values() for v in state.values() if torch.is_tensor(v)))


def _shard_model(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _flat(tensors):
    return torch.cat([t.detach().flatten() for t in tensors])


# --------------------------------------------------------------------------- 09.1 ZeRO-2's gradient sharding


def _zero2_on_ranks(zero2_step):
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model()
    reference = Zero1(model.parameters(), LR)
    for step in range(STEPS):
        loss_on(model, step, rank, n).backward()
        reference.step()
        if step == 0:
            reference_grad = reference.last_grad.clone()
        reference.zero_grad()
    reference_params = _flat(model.parameters())

    model = make_model()
    opt = Zero1(model.parameters(), LR)
    seen, inner = [], opt.optim.step

    def spy(*args, **kwargs):                 # what Adam is handed, at each of its steps
        seen.append(None if opt.shard.grad is None else opt.shard.grad.detach().clone())
        return inner(*args, **kwargs)

    opt.optim.step = spy
    left = []
    for step in range(STEPS):
        loss_on(model, step, rank, n).backward()
        zero2_step(opt)
        left.append(sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None))
        opt.zero_grad()
    return {"size": opt.size, "seen": seen, "left": left, "params": _flat(model.parameters()),
            "reference_grad": reference_grad, "reference_params": reference_params}


@exercise("09.1", CHAPTER, "ZeRO-2's gradient sharding, after the backward: Zero1's step freeing the gradients",
          "section 2 (ZeRO-1 by hand) and section 4 (the ZeRO stages)")
def check_zero2_step(zero2_step) -> str:
    initial = _flat(make_model().parameters())
    for world in (2, 3):
        ranks = _launch.launch(_zero2_on_ranks, world, args=(zero2_step,), timeout=20)
        padded = f" (the flat vector padded to {ranks[0]['size'] * world:,})" if world == 3 else ""
        for rank, r in enumerate(ranks):
            where = f"world_size={world}{padded}, rank {rank}"
            if len(r["seen"]) != STEPS or r["seen"][0] is None:
                raise Wrong(f"{where}: Adam's steps in {STEPS} calls of zero2_step, and its gradient",
                            f"{STEPS} steps, each with a gradient", f"{len(r['seen'])} steps, gradients "
                            f"{['none' if g is None else tuple(g.shape) for g in r['seen']]}",
                            "each step runs the inner Adam (opt.optim) once, on opt.shard with its .grad set")
            got, want = r["seen"][0], r["reference_grad"]
            if got.shape != want.shape:
                raise Wrong(f"{where}, step 1: the shape of the gradient Adam got", tuple(want.shape),
                            tuple(got.shape), "Adam updates this rank's part of the flat vector only")
            off = ((got - want).abs().max() / want.abs().max()).item()
            if off > GRAD_RTOL:
                ratio = (got.abs().max() / want.abs().max()).item()
                raise Wrong(f"{where}, step 1: the gradient Adam got, against one process's (max relative gap)",
                            f"<= {GRAD_RTOL:g}", f"{off:.2g} (its largest value is {ratio:.3g} x the expected)",
                            "Adam must get the average over the ranks of this rank's part, as DDP averages")
            if any(r["left"]):
                raise Wrong(f"{where}: bytes of whole gradients (p.grad) left after each step()", [0] * STEPS,
                            r["left"], "ZeRO-2's gradient sharding frees each whole gradient once it has been "
                            "reduce-scattered")
            moved = (r["reference_params"] - initial).abs().max()
            gap = ((r["params"] - r["reference_params"]).abs().max() / moved).item()
            if gap > TOL:
                raise Wrong(f"{where}: the parameters after {STEPS} steps, against Zero1's (max gap / update)",
                            f"<= {TOL:g}", round(gap, 4), "after Adam's step, all-gather every rank's updated "
                            "part into the parameters, as Zero1 does")
    return (f"on 2 and 3 ranks (3: a padded flat vector), for {STEPS} steps, Adam got one process's averaged "
            "gradient for the rank's part, no whole gradient was left after step(), and the parameters "
            "ended where Zero1's did.")


# --------------------------------------------------------------------------- 09.3 the crossing


def _activations_and_states(tokens_list):
    """On each rank: the activations a DDP forward saves per token count, and the states DDP and FSDP2 hold."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for tokens in tokens_list:                  # activations: the forward's, whatever holds the states
        model = DDP(make_model())
        exclude = {p.untyped_storage().data_ptr() for p in model.parameters()}
        sequence = torch.randint(VOCAB, (1, tokens + 1), generator=torch.Generator().manual_seed(rank))
        saved = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in exclude:
                saved[storage.data_ptr()] = storage
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = F.cross_entropy(model(sequence[:, :-1].clone()), sequence[0, 1:].clone())
        out["activations", tokens] = sum(storage.nbytes() for storage in saved.values())
        loss.backward()
    for strategy in ("DDP", "FSDP2"):           # states: after one step, as section 1 and section 5 count
        model = DDP(make_model()) if strategy == "DDP" else _shard_model(make_model(), init_device_mesh("cpu", (n,)))
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        loss_on(model, 0, rank, n).backward()
        opt.step()
        out[strategy] = _held(model, opt)
    return out


@exercise("09.3", CHAPTER, "the tokens per rank from which activations outweigh the states",
          "section 1 (where a step's memory goes) and section 5 (what FSDP2 holds)")
def check_crossing_tokens(crossing_tokens) -> str:
    answers = {(world, strategy): crossing_tokens(world, strategy) for world in (1, 2, 4)
               for strategy in ("DDP", "FSDP2")}
    on_four = {}
    for world in (1, 2, 4):
        ranks = _launch.launch(_activations_and_states, world, args=((1, 2),), timeout=20)
        one, two = ranks[0]["activations", 1], ranks[0]["activations", 2]
        per_token, fixed = two - one, 2 * one - two
        for strategy in ("DDP", "FSDP2"):
            states = max(r[strategy] for r in ranks)                           # the busiest rank's
            expected = (states - fixed) // per_token + 1                       # the first count that outweighs
            got = answers[world, strategy]
            if got != expected:
                raise Wrong(f"world_size={world}, {strategy}", expected, got,
                            f"measured on the ranks: states {states:,} bytes, activations {per_token:,} bytes "
                            f"per token + {fixed}; the answer is the first token count whose activations "
                            "weigh more, and only sharding divides the states by the ranks")
            if world == 4:
                on_four[strategy] = expected
    return ("your token counts equal the first ones whose activations outweigh the states, measured on 1, 2 "
            f"and 4 real ranks under DDP and FSDP2 (on 4 ranks: from {on_four['DDP']} and {on_four['FSDP2']}).")


# --------------------------------------------------------------------------- 09.4 DCP to one file


def _save_sharded(path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    model = _shard_model(make_model(), init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_on(model, 0, dist.get_rank(), dist.get_world_size()).backward()
    opt.step()
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.save(state, checkpoint_id=path)

    def full(value):
        if isinstance(value, dict):
            return {k: full(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(full(v) for v in value)
        if isinstance(value, DTensor):
            return value.full_tensor()
        return value.clone() if torch.is_tensor(value) else value

    return full(state)


def _first_difference(a, b, where="state"):
    """None when ``a`` equals ``b`` to the bit; otherwise (where, expected, got)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return where + ": keys", sorted(map(str, a)), sorted(map(str, b)) if isinstance(b, dict) else type(b)
        for key in a:
            found = _first_difference(a[key], b[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return where, f"{len(a)} items", b
        return next((d for d in (_first_difference(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
                     if d), None)
    if torch.is_tensor(a):
        if not torch.is_tensor(b) or type(b) is not torch.Tensor:
            return where, "a plain, whole tensor", type(b).__name__
        if a.dtype != b.dtype or a.shape != b.shape:
            return where, (a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape))
        if not torch.equal(a, b):
            return where, "the same bits", f"max difference {(a.double() - b.double()).abs().max().item():.3g}"
        return None
    return None if a == b else (where, a, b)


@exercise("09.4", CHAPTER, "a DCP checkpoint turned into one torch.save file",
          "section 6 (sharded checkpoints)")
def check_one_file_state(one_file_state) -> str:
    for world in (1, 3):
        with tempfile.TemporaryDirectory() as folder:
            sharded, single = os.path.join(folder, "sharded"), os.path.join(folder, "one.pt")
            saved = _launch.launch(_save_sharded, world, args=(sharded,), timeout=20)[0]
            got = one_file_state(sharded, single)
            case = f"a checkpoint saved by {world} rank{'s' if world > 1 else ''}"
            if not os.path.isfile(single):
                raise Wrong(f"{case}: the file at path", "one torch.save file", "no file",
                            "write the converted checkpoint to path")
            found = _first_difference(saved, got)
            if found:
                where, expected, actual = found
                raise Wrong(f"{case}: {where}", expected, actual, "return the whole state the ranks saved, "
                            "model and optimizer, as torch.load reads it back from the one file")
            found = _first_difference(saved, torch.load(single, weights_only=True))
            if found:
                raise Wrong(f"{case}: torch.load(path){found[0].removeprefix('state')}", found[1], found[2],
                            "the file itself must hold the whole state")
    return ("checkpoints saved by 1 and by 3 FSDP2 ranks (3: uneven shards) became one torch.save file whose "
            "model and optimizer state equal what the ranks saved, to the bit.")
