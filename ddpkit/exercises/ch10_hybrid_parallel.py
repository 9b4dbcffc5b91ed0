"""Checks for chapter 10's exercises (``notebooks/10_hybrid_parallel.ipynb``).

* 10.1 ``mesh_groups(rank, shape, names)``: a rank's group along each mesh dimension, against the
  groups of real ``DeviceMesh`` objects on 4 and 6 ranks (2-D meshes in both name orders, dimensions of
  size 1, a 3-D mesh);
* 10.2 ``fsdp_bytes(replicate, shard, parameters, per_machine)``: each rank's bytes per step inside a
  machine and across machines for FSDP2 (1-D) and HSDP (2-D), against what real ranks training the
  chapter's model recorded with ``ddpkit.Traffic`` on 2 and 4 ranks, with 1, 2 and 4 ranks per machine;
* 10.5 ``tp_over_compute(model, layout, bandwidth)``: tensor parallelism's time per step over the
  computation's, against the chapter's planner (section 6) for section 6's model and variants.

Exercises 3 and 4 (pipelined microbatches, a fake 4 x 4 mesh) get a self-check
(:func:`ddpkit.exercises.reveal`). The workers below rebuild the chapter's model (section 0) at its sizes.
"""

from __future__ import annotations

import math

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "10_hybrid_parallel"
D, HIDDEN, BLOCKS, BATCH, TOKENS, STEPS, LR = 32, 128, 2, 8, 8, 3, 0.5
PARAMETERS = BLOCKS * (D * HIDDEN + HIDDEN + HIDDEN * D + 3 * D)      # 16,832
SHARE = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: n - 1,
         "reduce-scatter": lambda n: (n - 1) / n, "send": lambda n: 1, "recv": lambda n: 0}


# --------------------------------------------------------------------------- 10.1


def _mesh_groups_on_ranks(cases):
    """On each rank: ``{names: {name: global ranks of this rank's group}}`` of real meshes."""
    import torch.distributed as dist

    from .._cluster import quiet_mesh

    out = []
    for shape, names in cases:
        mesh = quiet_mesh(shape, names)
        out.append({name: tuple(dist.get_process_group_ranks(mesh.get_group(name))) for name in names})
    return out


@exercise("10.1", CHAPTER, "a rank's groups in a device mesh", "section 1 (which ranks share a group)")
def check_mesh_groups(mesh_groups) -> str:
    cases = {4: [((2, 2), ("dp", "tp")), ((2, 2), ("tp", "dp")), ((4, 1), ("dp", "tp")), ((1, 4), ("dp", "tp")),
                 ((2, 1, 2), ("pp", "dp", "tp"))],
             6: [((2, 3), ("dp", "tp")), ((3, 2), ("tp", "dp"))]}
    checked = 0
    for world, per_world in cases.items():
        per_rank = _launch.launch(_mesh_groups_on_ranks, world, args=(per_world,), timeout=20)
        for k, (shape, names) in enumerate(per_world):
            for rank in range(world):
                expected = per_rank[rank][k]
                got = mesh_groups(rank, shape, names)
                got = {name: tuple(int(r) for r in ranks) for name, ranks in dict(got).items()}
                if got != expected:
                    raise Wrong(f"shape={shape}, names={names}, rank {rank}", expected, got,
                                "init_device_mesh lays torch.arange(world_size) out row-major, and a dimension's "
                                "group holds the ranks that differ from yours only in that coordinate")
                checked += 1
    return (f"your groups equal those of real DeviceMesh objects for all {checked} ranks of 7 meshes on 4 and 6 "
            "ranks (both name orders, dimensions of size 1, a 3-D mesh).")


# --------------------------------------------------------------------------- 10.2


def _fsdp_records(meshes):
    """On each rank: the ``Traffic`` records of 3 SGD steps of the chapter's model under FSDP2 on each mesh."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    from .._cluster import Traffic, quiet_mesh

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.w1, self.w2 = nn.LayerNorm(D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

        def forward(self, x):
            return x + self.w2(F.gelu(self.w1(self.norm(x))))

    x = torch.randn(BATCH, TOKENS, D, generator=torch.Generator().manual_seed(1))
    target = torch.randn(BATCH, TOKENS, D, generator=torch.Generator().manual_seed(2))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for replicate, shard in meshes:
        mesh = quiet_mesh((shard,), ("shard",)) if replicate == 1 else quiet_mesh((replicate, shard),
                                                                                   ("replicate", "shard"))
        torch.manual_seed(0)
        model = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        with Traffic() as traffic:
            for _ in range(STEPS):
                F.mse_loss(model(x.chunk(world)[rank]), target.chunk(world)[rank]).backward()
                optimizer.step()
                optimizer.zero_grad()
        out.append((traffic.seen, traffic.other))
    return out


def _inside_and_across(records, per_machine):
    inside = across = 0.0
    for kind, group, numel, itemsize in records:
        sent = SHARE[kind](len(group)) * numel * itemsize / STEPS
        if len({g // per_machine for g in group}) == 1:
            inside += sent
        else:
            across += sent
    return round(inside), round(across)


@exercise("10.2", CHAPTER, "FSDP's and HSDP's bytes inside and across machines",
          "section 3 (HSDP) and section 5 (bytes per step)")
def check_fsdp_bytes(fsdp_bytes) -> str:
    cases = {2: [(1, 2)], 4: [(1, 4), (2, 2)]}
    checked = 0
    for world, meshes in cases.items():
        per_rank = _launch.launch(_fsdp_records, world, args=(meshes,), timeout=30)
        for k, (replicate, shard) in enumerate(meshes):
            for per_machine in (1, 2, 4):
                if per_machine > world:
                    continue
                splits = {_inside_and_across(rank[k][0], per_machine) for rank in per_rank}
                assert len(splits) == 1 and not any(rank[k][1] for rank in per_rank), (splits, per_rank[0][k][1])
                expected = splits.pop()
                got = tuple(fsdp_bytes(replicate, shard, PARAMETERS, per_machine))
                if len(got) != 2 or any(abs(g - e) > 1 for g, e in zip(got, expected)):
                    raise Wrong(f"replicate={replicate}, shard={shard}, parameters={PARAMETERS:,}, "
                                f"per_machine={per_machine} (inside, across)", expected, got,
                                "count per group: FSDP's collectives in the shard group, HSDP's all-reduce, of what a rank holds after "
                                "the reduce-scatter, in the replicate group; a group is inside only if all its ranks share one "
                                "machine")
                checked += 1
    return (f"your (inside, across) bytes equal what real ranks recorded in all {checked} cases: FSDP over 2 and 4 "
            "ranks and HSDP on 2 x 2, with 1, 2 and 4 ranks per machine.")


# --------------------------------------------------------------------------- 10.5

GPU_FLOPS, UTILISATION = 989e12, 0.40
BIG = {"blocks": 32, "sharded": 12 * 4096 ** 2, "replicated": 2 * 4096, "sublayers": 2, "width": 4096,
       "sequences": 1024, "tokens": 4096, "microbatches": 16, "itemsize": 2}
CLUSTER = {"pp": 4, "dp_shard": 16, "tp": 8}


def _planner_ratio(model, layout, bandwidth):
    """The chapter's planner (section 6): tp's bytes per rank and step / bandwidth, over the computation."""
    p, r, s, t = (layout.get(role, 1) for role in ("pp", "dp_replicate", "dp_shard", "tp"))
    m = model["microbatches"] if p > 1 else 1
    activation = model["sequences"] // (r * s * m) * model["tokens"] * model["width"]
    count = 2 * model["sublayers"] * model["blocks"] // p * m
    sent = count * 2 * (t - 1) / t * activation * model["itemsize"] if t > 1 else 0.0
    parameters = model["blocks"] * (model["sharded"] + model["replicated"])
    compute = 6 * parameters * model["sequences"] * model["tokens"] / (p * r * s * t * GPU_FLOPS * UTILISATION)
    return sent / bandwidth / compute


def _width(model, width):
    return {**model, "width": width, "sharded": 12 * width ** 2, "replicated": 2 * width}


@exercise("10.5", CHAPTER, "tensor parallelism's time over the computation's",
          "section 5 (the tp formula) and section 6 (the realistic model)")
def check_tp_over_compute(tp_over_compute) -> str:
    nvlink, adapter = 450e9, 50e9
    cases = [("tp 1, dp_shard 8", BIG, {"dp_shard": 8}, nvlink),
             ("tp 2 alone", BIG, {"tp": 2}, nvlink),
             ("section 6's cluster, NVLink", BIG, CLUSTER, nvlink),
             ("section 6's cluster, one adapter", BIG, CLUSTER, adapter),
             ("4 times the batch", {**BIG, "sequences": 4096}, CLUSTER, adapter),
             ("dp_shard 64 x tp 8, no pipeline", BIG, {"dp_shard": 64, "tp": 8}, adapter),
             ("half the width", _width(BIG, 2048), CLUSTER, adapter),
             ("width 1024, tp 16, float32", {**_width(BIG, 1024), "itemsize": 4}, {"pp": 2, "tp": 16}, adapter)]
    for label, model, layout, bandwidth in cases:
        expected = _planner_ratio(model, layout, bandwidth)
        got = float(tp_over_compute(dict(model), dict(layout), bandwidth))
        if not math.isclose(got, expected, rel_tol=1e-3, abs_tol=1e-9):
            raise Wrong(f"{label}: layout={layout}, {bandwidth / 1e9:.0f} GB/s", round(expected, 4), round(got, 4),
                        "per block and microbatch tensor parallelism all-reduces the activations once per sublayer "
                        "forward and once backward; the computation is 6 x parameters x tokens over all GPUs")
    return (f"your ratios equal the chapter's planner (within 0.1%) in all {len(cases)} cases: tp 1, 2, 8 and 16, "
            "with and without pipelining, 4 times the batch, half and a quarter of the width, NVLink and one adapter.")
