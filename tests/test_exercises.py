"""Exercise checks (issue 21): each check passes its worked solution, reads an untouched attempt as
"not attempted", and fails the usual wrong answer with the message a learner needs, on real ranks.

The planted mistakes run through instructor mode (``python -m ddpkit check``) on a copy of the chapter
whose attempt cell holds the mistake, so the tests also cover the way an instructor checks a class.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpkit
import ddpkit.exercises as ex
from ddpkit.exercises import _notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS_WITH_CHECKS = sorted({e.chapter for e in ex.exercises()})

# The usual mistake per exercise: the attempt cell's source, and words the answer must contain.
PLANTED = {
    "01.1": ('''
def predict_ranks(world_size, nnodes):               # round robin: rank r on machine r % nnodes
    if world_size % nnodes:
        raise ValueError("uneven")
    return [(r, r // nnodes, r % nnodes) for r in range(world_size)]
''', ["smallest case that fails: world_size=4, nnodes=2", "expected: [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]",
      "got:      [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]", "fill one after the other", "section 3"]),
    "01.2": ('''
import os
import ddpkit
def log_epoch_own_file(log_dir):                      # named by LOCAL_RANK: machines share the names
    env = ddpkit.dist_env()
    with open(os.path.join(log_dir, f"log-{env.local_rank}.txt"), "a") as f:
        f.write(f"epoch 1 finished (written by rank {env.rank})\\n")
''', ["smallest case that fails: world_size=4, nnodes=2", "expected: 4 files, each written by one rank",
      '"log-0.txt": [0, 0, 2, 2]', "unique in the whole job", "section 3"]),
    "01.3": ('''
import os, torch, ddpkit
def save_then_load(model, ckpt_dir):                  # no barrier: the others may read before rank 0 wrote
    path = os.path.join(ckpt_dir, "model.pt")
    if ddpkit.dist_env().is_main:
        torch.save(model.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
    return torch.load(path)
''', ["smallest case that fails: world_size=2", "what each rank loaded", '"FileNotFoundError"',
      "only once rank 0 has written it", "section 4"]),
    "02.1": ('''
import torch.distributed as dist
def init_tcp(addr, port, rank, world_size, timeout_s):   # no timeout: gloo's default, 30 minutes
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}?rank={rank}&world_size={world_size}")
''', ["world_size=3 but 2 processes started, timeout_s=1", "still waiting after 9 s", "30 minutes", "section 7"]),
    "02.3": ('''
def first_to_finish(store, rank):                         # set, then read: every later rank overwrites the prize
    store.set("winner", str(rank))
    return int(store.get("winner"))
''', ["the winner each rank saw", "expected: [1, 1, 1, 1]", "atomic", "section 4"]),
    "02.4": ('''
def group_store(store, group_name):                       # the shared store itself: every group's keys collide
    return store
''', ['through group "group-a"', "expected: group-a: rank 0", "a prefix of its own"]),
    "03.1": ('''
import torch, torch.distributed as dist
def parcel_ring():                                    # rank 0 always sends: to itself when it is alone
    rank, n = dist.get_rank(), dist.get_world_size()
    parcel = torch.zeros(n)
    if rank > 0:
        dist.recv(parcel, src=rank - 1)
    parcel[rank] = rank + 1
    dist.send(parcel, dst=(rank + 1) % n)
    if rank == 0:
        dist.recv(parcel, src=n - 1)
    return parcel
''', ["smallest case that fails: world_size=1: rank 0's parcel", "expected: [1.0]", "Invalid destination rank",
      "nothing to send", "section 1"]),
    "03.3": ('''
import torch, torch.distributed as dist
def all_gather_via_all_reduce(tensor):                # every rank writes into slot 0
    slots = torch.zeros((dist.get_world_size(), *tensor.shape), dtype=tensor.dtype)
    slots[0] = tensor
    dist.all_reduce(slots)
    return list(slots.unbind(0))
''', ["smallest case that fails: world_size=2, call 1 of 4", "rank 0's result", "its own slot", "section 2"]),
    "03.4": ('''
import torch, torch.distributed as dist
def ring_all_average(tensor):                         # divides the input and the sum: by n twice
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list((tensor / n).tensor_split(n))
    def exchange(s, r):
        incoming = torch.empty_like(chunks[r])
        if rank % 2 == 0:
            dist.send(chunks[s], dst=(rank + 1) % n); dist.recv(incoming, src=(rank - 1) % n)
        else:
            dist.recv(incoming, src=(rank - 1) % n); dist.send(chunks[s], dst=(rank + 1) % n)
        return incoming
    for step in range(n - 1):
        chunks[(rank - step - 1) % n] += exchange((rank - step) % n, (rank - step - 1) % n)
    for step in range(n - 1):
        chunks[(rank - step) % n].copy_(exchange((rank - step + 1) % n, (rank - step) % n))
    return torch.cat(chunks) / n
''', ["smallest case that fails: world_size=2, 1 element per rank: rank 0's result", "divide that sum by the "
      "world size once", "section 4"]),
    "04.2": ('''
import torch.distributed as dist, torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
import ddpkit
def buckets_per_backward(model, bucket_cap_mb, steps=3):   # one counter for the whole run, never reset
    data = ddpkit.load_digits()
    model, calls, counts = DDP(model, bucket_cap_mb=bucket_cap_mb), [0], []
    def counting(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting)
    for _ in range(steps):
        model.zero_grad()
        F.cross_entropy(model(data.x_train[:16]), data.y_train[:16]).backward()
        counts.append(calls[0])
    return counts
''', ["bucket_cap_mb=0.01, 3 backward passes on 1 rank", "expected: [1, 2, 2]", "got:      [1, 3, 5]",
      "count each backward's calls on their own", "section 4"]),
    "04.5": ('''
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
class EverySecondStep:
    def __init__(self):
        self.step = 0
def every_second_step_hook(state, bucket):          # a skipped step applies each rank's own gradient
    state.step += 1
    if state.step % 2 == 0:
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    return default_hooks.allreduce_hook(None, bucket)
''', ["world_size=2, step 1 (2 buckets per backward after step 0): the replicas after the step",
      "bit-identical on every rank", "the same gradient",
      "section 5"]),
    "04.6": ('''
import time, torch, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
import ddpkit
def step_costs(per_rank_batch):                     # counts the gradients' numbers, not their bytes
    data = ddpkit.load_digits()
    x, y = data.x_train.repeat(2, 1)[:per_rank_batch], data.y_train.repeat(2)[:per_rank_batch]
    model, sent = DDP(ddpkit.digits_mlp(hidden=1024, depth=2, seed=0)), []
    def counting(state, bucket):
        sent.append(bucket.buffer().numel())
        return default_hooks.allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting)
    F.cross_entropy(model(x), y).backward()
    start = time.perf_counter()
    F.cross_entropy(model.module(x), y).backward()
    compute = time.perf_counter() - start
    grads = torch.zeros(sum(p.numel() for p in model.parameters()))
    start = time.perf_counter()
    dist.all_reduce(grads)
    return {"bytes": sum(sent), "compute_ms": 1000 * compute, "all_reduce_ms": 1000 * (time.perf_counter() - start)}
''', ["per_rank_batch=16 on 2 ranks: bytes all-reduced per step", "expected: 4505640", "got:      1126410",
      "numel() x element_size()"]),
    "05.1": ('''
def padding_duplicates(n, world_size, epoch):        # the unshuffled guess: always the first items
    total = -(-n // world_size) * world_size
    return (list(range(n)) * total)[n:total]
''', ["smallest case that fails: n=2, world_size=3, epoch=1", "expected: [1]", "got:      [0]", "the epoch's own order",
      "section 1"]),
    "05.2": ('''
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler
def mean_test_loss(model, x, y):                     # padded shares, and the mean of the ranks' means
    idx = list(DistributedSampler(range(len(y)), shuffle=False))
    with torch.no_grad():
        loss = F.cross_entropy(model(x[idx]), y[idx]).double().reshape(1)
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()
''', ["world_size=2 (357 test images", "count each test image once", "section 4"]),
    "05.4": ('''
import math, torch, torch.distributed as dist
class DistributedLengthGroupedSampler:               # seeded by rank: the ranks cut different orders
    def __init__(self, lengths, chunk_per_rank=100, num_replicas=None, rank=None, seed=0):
        self.lengths, self.seed, self.epoch = list(lengths), seed, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.chunk, self.total = chunk_per_rank * self.world, math.ceil(len(self.lengths) / self.world) * self.world
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch + self.rank)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        order = (order * self.total)[: self.total]
        grouped = [i for s in range(0, self.total, self.chunk) for i in sorted(order[s:s + self.chunk], key=self.lengths.__getitem__)]
        return iter(grouped[self.rank::self.world])
''', ["samples covered and duplicated", "the same generator seed on every rank"]),
    "06.1": ('''
def restart_plan(crash_at, crashes, max_restarts):  # resumes from the checkpoint before the crash step, never at it
    status, starts, done, checkpoint = 1, [], {}, 0
    for attempt in range(max_restarts + 1):
        starts.append(checkpoint)
        crash = attempt < crashes
        reached = crash_at if crash else 12
        for step in range(checkpoint, reached):
            done[step] = done.get(step, 0) + 1
        checkpoint = max(0, (reached - 1) // 3 * 3)
        if not crash:
            status = 0
            break
    return status, starts, sorted(s for s, n in done.items() if n > 1)
''', ["smallest case that fails: crash_at=6, crashes=1, max_restarts=1", "expected: (0, [0, 6], [])",
      "got:      (0, [0, 3], [3, 4, 5])", "latest checkpoint on disk", "section 3"]),
    "06.2": ('''
import torch, torch.distributed as dist
def save_checkpoint(state, path):                    # straight over the old file: a failed save destroys it
    if dist.get_rank() == 0:
        torch.save(state, path)
    dist.barrier()
''', ["smallest case that fails: world_size=1, failing save", 'expected: ["rank 0, step 9"]', "RuntimeError",
      "leave the previous checkpoint whole", "section 3"]),
    "06.3": ('''
def checkpoint(model, opt, sched):                   # the scheduler left out: its count starts again at 0
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}
def restore(ckpt, model, opt, sched):
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
''', ["smallest case that fails: world_size=2, resumed from the checkpoint at step 3 of 12", "expected: [0.0, 0.0]",
      "the scheduler's count of steps", "section 3"]),
    "06.6": ('''
from torch.utils.data import DistributedSampler
def rest_of_epoch(n, epoch, old_world_size, batches_done, batch_size):   # skips the batches as if the world were the same
    sampler = DistributedSampler(range(n), shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)[batches_done * batch_size:]
''', ["smallest case that fails: n=10, epoch=1, from 4 ranks after 2 batches of 1 to 1 rank: share lengths",
      "expected: [2]", "got:      [8]", "section 3"]),
    "07.2": ('''
def gpipe_idle(times, m):                            # the equal-stage formula, whatever the stage times
    p = len(times)
    return (p - 1) / (m + p - 1)
''', ["smallest case that fails: times=[2.0, 1.0], m=2", "expected: 0.4", "slowest stage", "section 2"]),
    "07.3": ('''
def peak_activation_bytes(schedule, p, m, batch, width):   # three tensors per microbatch on every rank
    tensor = batch // m * width * 4
    return [(m if schedule == "GPipe" else min(m, p - r)) * 3 * tensor for r in range(p)]
''', ['smallest case that fails: schedule="1F1B", p=1, m=2', "expected: [65536]", "got:      [49152]",
      "the last rank's loss saves a tensor", "section 3"]),
    "07.4": ('''
def messages_per_step(schedule, p, m, v=1):          # every stage boundary sends, even on one rank
    boundaries = p - 1 if schedule == "1F1B" else v * p - 1
    return 2 * m * boundaries
''', ['smallest case that fails: schedule="Interleaved1F1B", p=1, m=2, v=2', "expected: 0", "got:      4",
      "without a message", "section 4"]),
    "08.1": ('''
import torch.nn.functional as F
def attend_f_each(attn, x, f):                       # the chapter's one f, before the three projections
    x = f(x)
    B, T, _ = x.shape
    q, k, v = (w(x).view(B, T, -1, attn.head_dim).transpose(1, 2) for w in (attn.wq, attn.wk, attn.wv))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
''', ["smallest case that fails: world_size=2: all-reduces", 'expected: {"forward": 2, "backward": 4}',
      'got:      {"forward": 2, "backward": 2}', "its own f", "section 6"]),
    "08.2": ('''
def bytes_per_step(world_size, tokens):              # the MLP's two all-reduces, not the block's four
    share = 2 * (world_size - 1) / world_size
    return 2 * share * tokens * 32 * 4, share * 12_704 * 4
''', ["smallest case that fails: world_size=2, tokens=1 (1 x 1): tensor parallelism", "expected: 512",
      "got:      256.0", "two sublayers", "section 3"]),
    "08.3": ('''
def believed_shape(shape, dim, world_size, rank):    # as if from_local knew the real global shape
    return tuple(shape)
''', ["smallest case that fails: shape=(5, 3), Shard(0), world_size=3, rank 0", "expected: (6, 3)",
      "got:      (5, 3)", "does not communicate", "section 4"]),
    "09.1": ('''
import torch, torch.distributed as dist
def zero2_step(opt):                                 # Zero1's step as it was: the whole gradients kept
    grad = torch.empty(opt.size)
    dist.reduce_scatter_single(grad, opt.flat([p.grad for p in opt.params]))
    opt.shard.grad = grad / opt.n
    opt.optim.step()
    everything = torch.empty(opt.size * opt.n)
    dist.all_gather_single(everything, opt.shard.detach())
    with torch.no_grad():
        for p, value in zip(opt.params, everything.split([p.numel() for p in opt.params] + [opt.pad])):
            p.copy_(value.view_as(p))
''', ["smallest case that fails: world_size=2, rank 0: bytes of whole gradients (p.grad) left after each step()",
      "expected: [0, 0, 0]", "got:      [200704, 200704, 200704]", "frees each whole gradient", "section 2"]),
    "09.3": ('''
def crossing_tokens(world_size, strategy):           # as if DDP's states, too, shrank with the ranks
    states = 16 * 50_176 // world_size + 4 * 17
    return (states - 4) // 4_904 + 1
''', ["smallest case that fails: world_size=2, DDP", "expected: 164", "got:      82",
      "only sharding divides the states", "section 1"]),
    "09.4": ('''
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
def one_file_state(checkpoint_dir, path):            # the model's part only: Adam's state left behind
    dcp_to_torch_save(checkpoint_dir, path)
    return torch.load(path, weights_only=True)["model"]
''', ["smallest case that fails: a checkpoint saved by 1 rank: state: keys", 'expected: ["model", "optim"]',
      "model and optimizer", "section 6"]),
    "10.1": ('''
import math, torch
def mesh_groups(rank, shape, names):                 # column-major: the first dimension varies fastest
    layout = torch.arange(math.prod(shape)).view(shape[::-1]).permute(*reversed(range(len(shape))))
    coordinate = tuple(int(c) for c in (layout == rank).nonzero()[0])
    return {name: tuple(layout[coordinate[:k] + (slice(None),) + coordinate[k + 1:]].tolist())
            for k, name in enumerate(names)}
''', ["smallest case that fails: shape=(2, 2), names=('dp', 'tp'), rank 0", 'expected: {"dp": (0, 2), "tp": (0, 1)}',
      'got:      {"dp": (0, 1), "tp": (0, 2)}', "row-major", "section 1"]),
    "10.2": ('''
def fsdp_bytes(replicate, shard, parameters, per_machine):   # HSDP all-reduces the whole gradient, not its shard
    gather = 3 * (shard - 1) / shard * parameters * 4
    reduce = 2 * (replicate - 1) / replicate * parameters * 4
    inside = (gather if shard <= per_machine else 0) + (reduce if replicate * shard <= per_machine else 0)
    return round(inside), round(gather + reduce - inside)
''', ["smallest case that fails: replicate=2, shard=2, parameters=16,832, per_machine=1", "expected: (0, 134656)",
      "got:      (0, 168320)", "what a rank holds after the reduce-scatter", "section 3"]),
    "10.5": ('''
import math
GPU_FLOPS, UTILISATION = 989e12, 0.40
def tp_over_compute(model, layout, bandwidth):       # the forward's all-reduces only: the backward's forgotten
    p, t, n = layout.get("pp", 1), layout.get("tp", 1), math.prod(layout.values())
    share = model["sequences"] * model["tokens"] * t * p / n
    sent = model["sublayers"] * model["blocks"] / p * 2 * (t - 1) / t * share * model["width"] * model["itemsize"]
    compute = 6 * model["blocks"] * (model["sharded"] + model["replicated"]) * model["sequences"] * model["tokens"] / (n * GPU_FLOPS * UTILISATION)
    return sent / bandwidth / compute
''', ["smallest case that fails: tp 2 alone", "expected: 0.0477", "got:      0.0238", "once backward", "section 5"]),
    "11.1": ('''
def skip_step(loss, limit):                          # each rank decides alone, from its own loss
    return loss.item() > limit
''', ["smallest case that fails: world_size=2, rank 1's batch spikes at step 3", "point 4",
      "skipped steps per rank: [[], [3]]", "decide from every rank's loss", "section 6's fix"]),
    "11.2": ('''
swapped = {"error": "LaunchTimeoutError", "failed ranks": [0, 1],    # section 6's answer, timeouts not swapped
           "rank 0 in": "sync_gradients", "rank 1 in": "_finish_group"}
''', ["smallest case that fails: 'error'", "expected: RankFailedError", "got:      LaunchTimeoutError",
      "the group's 2 s or the launcher's 20 s", "section 6"]),
    "11.4": ('''
import hashlib, torch, torch.distributed as dist
def check_replicas(model):                           # only rank 0 compares and raises: the others train on
    mine = {n: hashlib.sha1(t.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest() for n, t in model.state_dict().items()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for name in mine:
        if dist.get_rank() == 0 and len({h[name] for h in everyone}) > 1:
            raise RuntimeError(f"replicas differ in {name}")
''', ["smallest case that fails: world_size=2, rank 1's 3.weight differs in the last bit of one number: which ranks "
       "raised", "expected: all 2 ranks", "got:      [0]", "raise on every rank", "section 7"]),
    "12.1": ('''
import numpy as np
def fit_ring(nbytes, seconds, n):                  # section 1's 2-rank factors, whatever n
    S, t = np.array(nbytes, dtype=float), np.array(seconds, dtype=float)
    design = np.stack([np.full_like(S, 2.0), S], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)
''', ["smallest case that fails: exact ring times T(S, 3)", "expected: (5e-05, 1e-09)", "both depend on n",
      "section 1"]),
    "12.2": ('''
def overlap(spans):                                # an all-reduce that starts in the window counts whole
    backward = [s for s in spans if s.kind == "backward"]
    start, end = min(s.start for s in backward), max(s.end for s in backward)
    comm = [s for s in spans if s.kind == "all-reduce"]
    inside = sum(s.end - s.start for s in comm if start <= s.start <= end)
    return inside / sum(s.end - s.start for s in comm), max(s.end for s in spans) - end
''', ["smallest case that fails: an all-reduce straddling the window's end", "expected: (0.5, 1.5)",
      "got:      (1.0, 1.5)", "only the part of each all-reduce", "section 2"]),
    "12.4": ('''
def ddp_bucket_bytes(grad_bytes, cap):             # the bytes cut into buckets of the cap, as if DDP split gradients
    total = sum(grad_bytes)
    return [cap] * (total // cap) + ([total % cap] if total % cap else [])
''', ["smallest case that fails: 2 gradients of 3 MiB and 1 MiB, cap 2 MiB", "expected: [3145728, 1048576]",
      "got:      [2097152, 2097152]", "never splits a gradient", "section 5"]),
}


# More wrong attempts that passed an earlier check: (id, exercise, the attempt cell's source, words the answer
# must contain). Each runs through instructor mode like PLANTED's.
MORE_PLANTED = [
    ("05.1-pads-even-splits", "05.1", """
import torch
def padding_duplicates(n, world_size, epoch):        # world_size - n % world_size: pads even when it divides n
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0 + epoch)).tolist()
    pad = world_size - n % world_size
    return perm[:pad]
""", ["smallest case that fails: n=1, world_size=1, epoch=0", "expected: []", "got:      [0]", "pads nothing",
      "section 1"]),
    ("05.1-never-wraps-twice", "05.1", """
import torch
def padding_duplicates(n, world_size, epoch):        # the order's first items: too few when padding > n
    total = -(-n // world_size) * world_size
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0 + epoch)).tolist()
    return order[: total - n]
""", ["smallest case that fails: n=1, world_size=3, epoch=0", "expected: [0, 0]", "got:      [0]",
      "wraps around its order more than once", "section 1"]),
    ("05.2-whole-set-on-every-rank", "05.2", """
import torch, torch.nn.functional as F
def mean_test_loss(model, x, y):                     # every rank evaluates the whole test set alone
    with torch.no_grad():
        return F.cross_entropy(model(x), y, reduction="none").double().mean().item()
""", ["smallest case that fails: world_size=2 (357 test images): the rows each rank passed through the model",
      "expected: at most 179 on each rank (its share)", "got:      [357, 357]", "its own share", "section 4"]),
    ("02.1-timeout-of-its-own", "02.1", """
import datetime
import torch.distributed as dist
def init_tcp(addr, port, rank, world_size, timeout_s):   # a timeout of its own: 5 s, whatever timeout_s says
    url = f"tcp://{addr}:{port}?rank={rank}&world_size={world_size}"
    dist.init_process_group("gloo", init_method=url, timeout=datetime.timedelta(seconds=5))
""", ["smallest case that fails: world_size=3 but 2 processes started, timeout_s=1", "expected: both ranks raise "
      "after about 1 s", "got:      the first after", "use the timeout_s you are given", "section 7"]),
    ("02.3-check-then-set", "02.3", """
def first_to_finish(store, rank):                    # check, then set: two steps, so every rank can claim
    if not store.check(["winner"]):
        store.set("winner", str(rank))
    return int(store.get("winner"))
""", ["every rank finishing at the same moment", "the winner each rank saw", "expected: one rank, the same on "
      "every rank", "got:      [0, 1, 2, 3]", "atomic", "section 4"]),
    ("04.5-counts-hook-calls", "04.5", """
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
class EverySecondStep:
    def __init__(self):
        self.calls, self.last = 0, {}
def every_second_step_hook(state, bucket):          # counts hook calls, not steps: no bucket.is_last()
    layout = tuple(p.data_ptr() for p in bucket.parameters())
    stored = state.last.get(layout)
    reuse = state.calls % 2 == 1 and stored is not None
    state.calls += 1
    if reuse:
        fut = torch.futures.Future()
        fut.set_result(stored.clone())
        return fut
    def remember(f):
        state.last[layout] = f.value().clone()
        return f.value()
    return default_hooks.allreduce_hook(None, bucket).then(remember)
""", ["smallest case that fails: world_size=2, step 2", "some buckets all-reduced, others reused, in the same step",
      "bucket.is_last()", "section 4"]),
    ("01.3-sleeps-instead-of-waiting", "01.3", """
import os, time, torch, ddpkit
def save_then_load(model, ckpt_dir):                  # no barrier: the other ranks sleep 2 s and hope
    path = os.path.join(ckpt_dir, "model.pt")
    if ddpkit.dist_env().is_main:
        torch.save(model.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
    else:
        time.sleep(2)
    return torch.load(path)
""", ["smallest case that fails: world_size=2, rank 0 on time: when each rank returned", "within 1 s of rank 0",
      "sleeps a fixed time", "section 4"]),
]

def _with_attempts(chapter: Path, attempts: dict[str, str], tmp_path: Path) -> Path:
    """A copy of ``chapter`` whose attempt cells for the given exercises hold the given source."""
    nb = json.loads(chapter.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for before, cell in zip(code, code[1:]):
        match = _notebook._CHECK.search("".join(cell["source"]))
        if match and match.group(1) in attempts:
            before["source"] = attempts[match.group(1)]
    path = tmp_path / chapter.name
    path.write_text(json.dumps(nb))
    return path


def test_the_public_surface_is_pinned():
    assert ex.__all__ == sorted(ex.__all__)
    assert set(ex.__all__) == {"Exercise", "Result", "Wrong", "attempt_cells", "check", "check_notebook",
                               "exercises", "reveal", "untouched", "worked_answer"}
    assert ddpkit.exercises is ex


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_CHECKS)
def test_each_checked_exercise_has_its_attempt_and_check_cell_in_the_chapter(chapter):
    keys = [e.key for e in ex.exercises(chapter)]
    assert len(keys) >= 3, f"chapter {chapter}: at least three checked exercises"
    assert [k for k, _, _ in _notebook.attempt_cells(NOTEBOOKS / f"{chapter}.ipynb")] == keys
    assert {k for k, _, _ in _notebook.attempt_cells(NOTEBOOKS / "solutions" / f"{chapter}.ipynb")} == set(keys)


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_CHECKS)
def test_the_chapter_as_shipped_reads_not_attempted_and_the_solutions_pass(chapter):
    shipped = _notebook.check_notebook(NOTEBOOKS / f"{chapter}.ipynb")
    assert [r.status for r in shipped] == ["not attempted"] * len(shipped), [str(r) for r in shipped]
    solved = _notebook.check_notebook(NOTEBOOKS / "solutions" / f"{chapter}.ipynb")
    assert [r.status for r in solved] == ["right"] * len(solved), [str(r) for r in solved]


def _planted_mistakes():
    yield from (pytest.param(key, *PLANTED[key], id=key) for key in sorted(PLANTED))
    yield from (pytest.param(key, source, words, id=name) for name, key, source, words in MORE_PLANTED)


@pytest.mark.parametrize(("key", "source", "words"), list(_planted_mistakes()))
def test_the_usual_mistake_fails_with_what_a_learner_needs(key, source, words, tmp_path):
    chapter = NOTEBOOKS / f"{ex.exercises(key.split('.')[0])[0].chapter}.ipynb"
    found = {r.exercise: r for r in _notebook.check_notebook(_with_attempts(chapter, {key: source}, tmp_path))}
    assert found[key].status == "wrong", str(found[key])
    for word in words:
        assert word in found[key].message, (word, found[key].message)
    assert "solution" not in found[key].message.lower()


def test_a_crashing_rank_gets_the_launchers_report_root_cause_first():
    def mean_test_loss(model, x, y):                  # right alone (world size 1); on 2 ranks, rank 1 gives up
        import torch.distributed as dist
        import torch.nn.functional as F

        if dist.get_rank() == 1:
            raise ValueError("rank 1 gave up")
        dist.barrier()
        return F.cross_entropy(model(x), y, reduction="none").double().mean().item()

    result = ex.check("05.2", mean_test_loss)
    assert result.status == "wrong"
    assert "did not finish on the ranks" in result.message
    lines = result.message.splitlines()
    assert lines[1] == "rank 1 of 2 failed: ValueError: rank 1 gave up"              # the root cause, first
    cause = result.message.split("Root Cause", 1)[1]
    assert cause.index("rank 1 (local rank 1") < cause.index("rank 0 (local rank 0")


def test_a_hanging_collective_ends_at_the_checks_timeout():
    def mean_test_loss(model, x, y):                  # right alone (world size 1); on 2 ranks, it hangs
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        if dist.get_rank() == 0:          # rank 1 never joins this all_reduce
            dist.all_reduce(torch.ones(1))
        return F.cross_entropy(model(x), y, reduction="none").double().mean().item()

    start = time.monotonic()
    result = ex.check("05.2", mean_test_loss)
    assert result.status == "wrong" and "did not finish" in result.message, result.message
    assert time.monotonic() - start < 60


def test_untouched_attempts_are_recognised_and_edited_ones_are_not():
    def body_raises(n):
        """A docstring does not count as an attempt."""
        raise NotImplementedError("your code here")

    def body_ellipsis(n):
        ...

    class Untouched:
        def __init__(self):
            raise NotImplementedError

        def __iter__(self):
            ...

    def started(n):
        x = n + 1
        raise NotImplementedError

    assert all(ex.untouched(a) for a in (body_raises, body_ellipsis, Untouched, ...))
    assert not any(ex.untouched(a) for a in (started, len, 3, lambda n: n))
    assert "not attempted yet" in ex.check("05.1", body_raises).message
    with pytest.raises(KeyError, match="the checked exercises are .*05.1, 05.2"):
        ex.check("99.1", started)


def test_instructor_mode_prints_one_line_per_exercise_and_an_exit_status(tmp_path):
    solved = {k: a for k, a, _ in _notebook.attempt_cells(NOTEBOOKS / "solutions" / "05_samplers.ipynb")}
    attempts = {"05.1": solved["05.1"], "05.2": PLANTED["05.2"][0]}          # 05.4 left untouched
    path = _with_attempts(NOTEBOOKS / "05_samplers.ipynb", attempts, tmp_path)
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    elapsed = time.monotonic() - start
    lines = run.stdout.splitlines()
    assert lines[0] == f"{path}: 1 of 3 checked exercises right", run.stdout + run.stderr
    assert lines[1] == "  05.1  done"
    assert lines[2].startswith("  05.2  wrong: ") and "smallest case that fails" in lines[2]
    assert lines[3] == "  05.4  not attempted"
    assert run.returncode == 1
    assert elapsed < 60, f"instructor mode took {elapsed:.0f} s"
    as_json = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(path), "--json"], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    report = json.loads(as_json.stdout)[str(path)]
    assert [(r["exercise"], r["status"]) for r in report] == [("05.1", "right"), ("05.2", "wrong"),
                                                               ("05.4", "not attempted")]


def test_instructor_mode_says_what_to_do_with_bad_input(tmp_path, capsys):
    """A usage error has an exit status of its own (3), apart from "not attempted" (2)."""
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(tmp_path / "missing.ipynb")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 3 and "no such notebook" in run.stderr, run
    for args in ([], ["--verbose", str(NOTEBOOKS / "05_samplers.ipynb")]):
        assert _notebook.main(args) == 3
        assert "usage: python -m ddpkit check" in capsys.readouterr().err
    assert _notebook.main(["--help"]) == 0
    assert "3 usage error" in capsys.readouterr().out
    assert _notebook.main([str(NOTEBOOKS / "05_samplers.ipynb")]) == 2        # untouched: not attempted
    assert capsys.readouterr().out.count("not attempted") == 3


def _temporary_exercise(key, checker):
    """Register ``checker`` as exercise ``key`` for one test (the registry is the real one)."""
    from ddpkit.exercises import _core

    _core.exercise(key, "99_test", "a test exercise", "section 1")(checker)
    return key


@pytest.fixture
def scratch_exercises():
    from ddpkit.exercises import _core

    before = set(_core._REGISTRY)
    yield _temporary_exercise
    for key in set(_core._REGISTRY) - before:
        del _core._REGISTRY[key]


def test_an_error_of_the_check_itself_is_not_blamed_on_the_learner(scratch_exercises):
    def buggy_checker(attempt):
        attempt(1)
        assert False, "the checker's own assert"

    def reference_fails(attempt):
        return {}["the reference's missing key"]

    def calls_it_wrongly(attempt):
        return attempt(1, 2, 3)

    def attempt(n):
        return n + 1

    found = ex.check(scratch_exercises("99.1", buggy_checker), attempt)
    assert found.status == "check error", found
    assert "the check itself failed, not your code" in found.message and "AssertionError" in found.message
    assert "your code raised" not in found.message and "not right yet" not in found.message
    assert ex.check(scratch_exercises("99.2", reference_fails), attempt).status == "check error"
    wrong = ex.check(scratch_exercises("99.3", calls_it_wrongly), attempt)  # the learner's signature: their error
    assert wrong.status == "wrong" and "your code raised TypeError" in wrong.message, wrong

    class NeedsAnArgument:                               # a class the check builds without arguments
        def __init__(self, x):
            self.x = x

    wrong = ex.check(scratch_exercises("99.8", lambda attempt: str(attempt())), NeedsAnArgument)
    assert wrong.status == "wrong" and "missing 1 required positional argument" in wrong.message, wrong


def test_a_not_implemented_error_reads_not_attempted_only_from_the_attempts_own_body(scratch_exercises):
    def in_process(attempt):
        return str(attempt(3))

    def on_ranks(attempt):
        from ddpkit import _launch

        return str(_launch.launch(attempt, 2, timeout=20))

    def started(n):
        x = n + 1
        raise NotImplementedError("not finished")

    def library_raises(n):
        import torch.utils.data

        return torch.utils.data.Dataset()[n]            # torch's NotImplementedError, not a placeholder

    def says_it(n=0):
        raise ValueError("NotImplementedError is in this message, but this is a ValueError")

    local, ranks = scratch_exercises("99.4", in_process), scratch_exercises("99.5", on_ranks)
    assert ex.check(local, started).status == "not attempted"
    assert ex.check(local, library_raises).status == "wrong"
    assert "your code raised NotImplementedError" in ex.check(local, library_raises).message

    def started_on_ranks():
        import torch.distributed as dist

        rank = dist.get_rank()
        raise NotImplementedError(f"rank {rank} not finished")

    def library_raises_on_ranks():
        import torch.utils.data

        return torch.utils.data.Dataset()[0]

    def says_it_on_ranks():
        raise ValueError("NotImplementedError is in this message, but this is a ValueError")

    assert ex.check(ranks, started_on_ranks).status == "not attempted"
    for attempt in (library_raises_on_ranks, says_it_on_ranks):
        found = ex.check(ranks, attempt)
        assert found.status == "wrong" and "did not finish on the ranks" in found.message, found
    assert ex.check(local, says_it).status == "wrong"


def test_a_function_that_never_returns_is_stopped(scratch_exercises, monkeypatch):
    from ddpkit.exercises import _core

    monkeypatch.setattr(_core, "ATTEMPT_TIMEOUT_S", 1)

    def calls_it(attempt):
        return f"returned {attempt(10, 4, 0)}"

    def spins(n, world_size, epoch):
        while True:
            try:
                n += 1
            except Exception:                            # cannot swallow the timeout
                pass

    def sleeps(n, world_size, epoch):
        import time

        time.sleep(60)

    key = scratch_exercises("99.6", calls_it)
    for attempt in (spins, sleeps):
        start = time.monotonic()
        found = ex.check(key, attempt)
        assert time.monotonic() - start < 10
        assert found.status == "wrong" and f"{attempt.__name__}(10, 4, 0) did not return within 1 s" in found.message
    assert ex.check(key, lambda n, world_size, epoch: []).message == "99.6 right: returned []"
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_strings_in_messages_are_shown_plainly(scratch_exercises):
    def checker(attempt):
        raise ex.Wrong("a case", "one file, written by rank 0", ["rank 0's weights", "FileNotFoundError"], "a hint")

    message = ex.check(scratch_exercises("99.7", checker), lambda: 0).message
    assert "  expected: one file, written by rank 0\n" in message
    assert """  got:      ["rank 0's weights", "FileNotFoundError"]\n""" in message


def test_instructor_mode_runs_the_cells_between_an_attempt_and_its_check(tmp_path):
    """A scratch cell (or a note) between the attempt and its check runs in order, as in the notebook."""
    solved = {k: a for k, a, _ in _notebook.attempt_cells(NOTEBOOKS / "solutions" / "05_samplers.ipynb")}
    nb = json.loads((NOTEBOOKS / "05_samplers.ipynb").read_text())
    cells = nb["cells"]
    first = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith('ddpkit.exercises.check("05.1"'))
    second = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith('ddpkit.exercises.check("05.2"'))
    code = lambda source: {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": source}
    note = {"cell_type": "markdown", "metadata": {}, "source": "My notes: try 10 items on 4 ranks."}
    cells[second:second] = [code("mean_test_loss(None, None, None)  # a scratch call: the untouched attempt raises")]
    cells[first - 1]["source"] = solved["05.1"]
    cells[first:first] = [note, code("padding_duplicates(10, 4, 0)\nprint('scratch')"), code("import math")]
    path = tmp_path / "05_samplers.ipynb"
    path.write_text(json.dumps(nb))
    assert [k for k, _, _ in _notebook.attempt_cells(path)] == ["05.1", "05.2", "05.4"]
    assert _notebook.attempt_cells(path)[0][1] == solved["05.1"]
    found = _notebook.check_notebook(path)
    assert [r.status for r in found] == ["right", "not attempted", "not attempted"], [str(r) for r in found]
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(path), "--json"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    report = json.loads(run.stdout)[str(path)]                 # the scratch cell's print went to stderr
    assert [r["status"] for r in report] == ["right", "not attempted", "not attempted"] and run.returncode == 2
    assert "scratch" in run.stderr


def test_reveal_shows_the_worked_answer_from_the_solutions_notebook():
    box = ex.reveal("05.5")
    text_box, button, shown = box.children
    assert shown.outputs == ()
    button.click()
    text = shown.outputs[0]["data"]["text/markdown"]
    assert "seed + rank" in text and "```python" in text and "solutions/05_samplers.ipynb" in text


def test_the_start_pages_plan_assigns_a_checked_exercise_in_every_chapter():
    cells = json.loads((NOTEBOOKS / "00_start_here.ipynb").read_text())["cells"]
    plan = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assigned = dict(re.findall(r"^\| \[(\d\d)\]\(\d\d_\w+\.ipynb\) \|.*\| Ex\. (\d+) \|$", plan, flags=re.M))
    assert sorted(assigned) == [f"{n:02d}" for n in range(1, 13)], assigned
    checked = {e.key for e in ex.exercises()}
    assert not [f"{c}.{k}" for c, k in assigned.items() if f"{c}.{k}" not in checked]
