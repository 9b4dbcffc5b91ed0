"""Meshes of ranks and the cluster they would run on (chapter 10): record, model and draw.

* :func:`quiet_mesh` builds a CPU ``DeviceMesh`` inside a rank without DTensor's log lines;
* :class:`Traffic` records every collective and message a rank takes part in;
* :func:`group_link` is the course's model of the link a process group's ring runs on;
* :func:`plan_table` prints a planner's rows; :func:`plot_mesh_groups` and
  :func:`plot_cluster_groups` draw a mesh's groups (Figures without pyplot, safe in a callback).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Traffic", "group_link", "plan_table", "plot_cluster_groups", "plot_mesh_groups", "quiet_mesh"]

# c10d's and DTensor's operator names -> the kind of traffic they are
_KINDS = {"allreduce_": "all-reduce", "all_reduce": "all-reduce", "_allgather_base_": "all-gather",
          "all_gather_into_tensor": "all-gather", "_reduce_scatter_base_": "reduce-scatter",
          "reduce_scatter_tensor": "reduce-scatter", "send": "send", "recv_": "recv"}


def quiet_mesh(shape: Sequence[int], names: Sequence[str], device_type: str = "cpu"):
    """``init_device_mesh(device_type, shape, mesh_dim_names=names)``, without DTensor's log lines.

    ``full_tensor()`` of a parameter sharded twice on one dimension (FSDP2 over tensor
    parallelism) logs a warning (a clock time in the log line's prefix) that it needs two
    all-gathers in a row; this drops the log messages of DTensor's redistribution in the calling
    process (a rank), then builds the mesh. Call it inside a rank with a default process group.

    >>> import ddpkit
    >>> ddpkit.launch(lambda: quiet_mesh((2,), ("dp",)).mesh.tolist(), 2)
    [[0, 1], [0, 1]]
    """
    from torch.distributed.device_mesh import init_device_mesh

    for name in ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._collective_utils"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
            logger.propagate = False
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))


class Traffic(TorchDispatchMode):
    """Record every collective and message this rank takes part in, while the ``with`` block runs.

    ``seen`` gets one ``(kind, global ranks of the group, numbers this rank puts in, bytes per
    number)`` per operation: c10d's (``dist.all_reduce``, FSDP2's all-gathers and
    reduce-scatters, ``dist.send`` and ``recv``) and DTensor's functional collectives. Kinds are
    ``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"``, ``"send"`` and ``"recv"``; a message's
    group is the pair of ranks it connects. Any other c10d operation lands in ``other`` (a check
    should assert it is empty). It records what the rank *ran*, not bytes counted inside the backend.

    >>> import ddpkit, torch, torch.distributed as dist
    >>> def work():
    ...     with Traffic() as traffic:
    ...         dist.all_reduce(torch.ones(3))
    ...     return traffic.seen, traffic.other
    >>> ddpkit.launch(work, 2)[0]
    ([('all-reduce', (0, 1), 3, 4)], [])
    """

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...], int, int]] = []
        self.other: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.distributed_c10d import _resolve_process_group  # private: a group's name -> group

        namespace, op = func.name().split(".")[0].split("::")
        if namespace in ("c10d", "_c10d_functional") and op in _KINDS:
            named = {**dict(zip((a.name for a in func._schema.arguments), args)), **(kwargs or {})}
            group = (_resolve_process_group(named["group_name"]) if "group_name" in named
                     else dist.ProcessGroup.unbox(named["process_group"]))
            ranks = tuple(dist.get_process_group_ranks(group))
            tensor = named.get("input_tensor", named.get("input", named.get("tensors")))
            tensor = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
            if op in ("send", "recv_"):
                peer = dist.get_global_rank(group, named["dst" if op == "send" else "src"])
                ranks = tuple(sorted((dist.get_rank(), peer)))
            self.seen.append((_KINDS[op], ranks, tensor.numel(), tensor.element_size()))
        elif namespace in ("c10d", "_c10d_functional") and not op.startswith(("wait", "_wrap")):
            self.other.append(op)
        return func(*args, **(kwargs or {}))


def group_link(group: Sequence[int], gpus_per_node: int, nvlink: float = 450e9,
               adapter: float = 50e9) -> tuple[str, float]:
    """The link a ring over ``group`` (global ranks) runs on, and its bytes per second per GPU and direction.

    The course's cluster model (chapter 10), with ranks numbered machine by machine as
    ``torchrun`` numbers them (``gpus_per_node`` consecutive ranks per machine):

    * all of the group on one machine: ``("NVLink", nvlink)``;
    * across machines, with ``g`` of the group's GPUs on each machine: every GPU has its own
      network adapter of ``adapter`` bytes per second on its own rail, and the collective library
      runs several rings at once, each crossing between machines through a different GPU's
      adapter (NCCL's channels), so the crossing is ``g`` adapters wide: ``("InfiniBand", adapter)``
      for one GPU per machine, ``("InfiniBand x g", min(g * adapter, nvlink))`` otherwise.

    An assumption, not a measurement: the group's rings are the only traffic on those adapters, at
    peak speed. Labels are short enough for :func:`plan_table`.

    >>> group_link(range(8), 8), group_link(range(16), 8), group_link(range(0, 128, 8), 8)
    (('NVLink', 450000000000.0), ('InfiniBand x8', 400000000000.0), ('InfiniBand', 50000000000.0))
    """
    per_machine = Counter(rank // gpus_per_node for rank in group)
    if len(per_machine) == 1:
        return "NVLink", nvlink
    g = min(per_machine.values())
    return ("InfiniBand", adapter) if g == 1 else (f"InfiniBand x{g}", min(g * adapter, nvlink))


def plan_table(rows: Sequence[dict[str, Any]]) -> str:
    """A planner's rows as a table: one line per mesh dimension.

    Each row has ``dim``, ``role``, ``group`` (global ranks), ``machines`` (the machines it
    spans), ``link``, ``counts`` ({kind: collectives per step}), ``bytes`` and ``seconds`` per step.
    A group of one rank uses no link (shown as "—").

    >>> print(plan_table([{"dim": "tp", "role": "tp", "group": (0, 1), "machines": [0], "link": "NVLink",
    ...                    "counts": {"all-reduce": 4}, "bytes": 2e9, "seconds": 0.004}]))
    dim  role           size  machines link          per step                                   GB sent  seconds
    tp   tp                2         1 NVLink        all-reduce 4                                 2.000    0.004
    """
    lines = [f"{'dim':4} {'role':13} {'size':>5} {'machines':>9} {'link':13} {'per step':40} {'GB sent':>9} "
             f"{'seconds':>8}"]
    for r in rows:
        kinds = ", ".join(f"{kind} {n}" for kind, n in r["counts"].items()) or "nothing"
        link = r["link"] if len(r["group"]) > 1 else "—"
        lines.append(f"{r['dim']:4} {r['role']:13} {len(r['group']):5} {len(r['machines']):9} {link:13} {kinds:40} "
                     f"{r['bytes'] / 1e9:9.3f} {r['seconds']:8.3f}")
    return "\n".join(lines)


def plot_mesh_groups(cases: Sequence[tuple[str, Sequence[str], Sequence[dict[str, Any]]]]):
    """Draw 2-D meshes: each rank at its coordinate, the groups of both dimensions outlined.

    ``cases`` are ``(title, (dimension 0's name, dimension 1's name), ranks)``, where ``ranks[r]``
    is rank ``r``'s report: ``{"coordinate": (i, j), name0: its group's ranks, name1: ...}``.
    Returns a :class:`matplotlib.figure.Figure` (no pyplot).

    >>> ranks = [{"coordinate": divmod(r, 2), "dp": (r % 2, r % 2 + 2), "tp": (r // 2 * 2, r // 2 * 2 + 1)}
    ...          for r in range(4)]
    >>> fig = plot_mesh_groups([("2 x 2", ("dp", "tp"), ranks)])
    >>> [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    ['"dp" groups: [0, 2], [1, 3]', '"tp" groups: [0, 1], [2, 3]']
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch, Rectangle

    fig = Figure(figsize=(3.6 * len(cases), 3.3), layout="constrained")
    for ax, (title, names, ranks) in zip(fig.subplots(1, len(cases), squeeze=False)[0], cases):
        where = {rank: tuple(r["coordinate"]) for rank, r in enumerate(ranks)}
        for rank, (i, j) in where.items():
            ax.add_patch(Rectangle((j - 0.28, i - 0.28), 0.56, 0.56, facecolor="whitesmoke", edgecolor="grey"))
            ax.text(j, i, f"rank {rank}\n{(i, j)}", ha="center", va="center", fontsize=8)
        for name, colour, pad, style in zip(names, ("#1f77b4", "#d62728"), (0.44, 0.36), ("--", "-")):
            groups = sorted({tuple(r[name]) for r in ranks})
            for group in groups:
                rows, cols = [where[g][0] for g in group], [where[g][1] for g in group]
                ax.add_patch(FancyBboxPatch((min(cols) - pad, min(rows) - pad), max(cols) - min(cols) + 2 * pad,
                                            max(rows) - min(rows) + 2 * pad, boxstyle="round,pad=0,rounding_size=0.08",
                                            fill=False, edgecolor=colour, linewidth=2, linestyle=style))
            ax.plot([], [], color=colour, linestyle=style, linewidth=2,
                    label=f'"{name}" groups: ' + ", ".join(str(list(g)) for g in groups))
        rows, cols = max(i for i, _ in where.values()), max(j for _, j in where.values())
        ax.set_xlim(-0.6, cols + 0.6)
        ax.set_ylim(rows + 0.6, -0.6)
        ax.set_aspect("equal")
        ax.set_xticks(range(cols + 1))
        ax.set_yticks(range(rows + 1))
        ax.set_xlabel(f'"{names[1]}" coordinate', fontsize=8)
        ax.set_ylabel(f'"{names[0]}" coordinate', fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7, frameon=False)
    return fig


_DIM_STYLES = (("#0072B2", "o"), ("#E69F00", "^"), ("#009E73", "X"))      # colour-blind-safe colours, and markers


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def plot_cluster_groups(shape: Sequence[int], names: Sequence[str], gpus_per_node: int, rank: int,
                        groups: Sequence[Sequence[int]]):
    """Draw a cluster's GPUs and one rank's groups, one colour and marker per mesh dimension.

    ``shape`` and ``names`` are the mesh's (up to 3 dimensions), ranks numbered machine by machine
    (``gpus_per_node`` each); ``groups[k]`` is ``rank``'s group of dimension ``k``. Up to 64
    machines, one cell per GPU (8 machines per row); beyond, one cell per machine (64 per row).
    ``rank`` (or its machine) is black. Returns a :class:`matplotlib.figure.Figure` (no pyplot).

    >>> fig = plot_cluster_groups((2, 8), ("dp", "tp"), 8, 0, [(0, 8), tuple(range(8))])
    >>> fig.axes[0].get_title().splitlines()[0]
    '16 ranks = dp 2 × tp 8 on 2 machines of 8 GPUs:'
    """
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.patches import Patch

    n = math.prod(shape)
    machines = math.ceil(n / gpus_per_node)
    per_gpu = machines <= 64
    width, across = (gpus_per_node + 1, min(machines, 8)) if per_gpu else (1, 64)
    down = math.ceil(machines / across)
    unit = (lambda r: r) if per_gpu else (lambda r: r // gpus_per_node)                    # a rank -> its cell
    place = (lambda u: divmod(u // gpus_per_node, across)[0] if per_gpu else u // across,  # a cell -> (row, column)
             lambda u: (u // gpus_per_node % across) * width + u % gpus_per_node if per_gpu else u % across)
    grid = np.full((down, across * width - (1 if per_gpu else 0)), np.nan)
    for u in {unit(r) for r in range(n)}:
        grid[place[0](u), place[1](u)] = 0
    for k, group in reversed(list(enumerate(groups))):
        for u in {unit(r) for r in group}:
            grid[place[0](u), place[1](u)] = k + 1
    grid[place[0](unit(rank)), place[1](unit(rank))] = 4
    fig = Figure(figsize=(7.5, 1.3 + 5.5 * min(1.0, down / grid.shape[1] * 2)), layout="constrained")
    ax = fig.add_subplot()
    colours = ["#dddddd", *(c for c, _ in _DIM_STYLES), "#000000"]
    ax.imshow(grid, cmap=ListedColormap(colours), vmin=0, vmax=4, interpolation="nearest", aspect="auto")
    ax.vlines(np.arange(0.5, grid.shape[1] - 1), -0.5, down - 0.5, colors="white", linewidth=0.6)     # cell edges
    ax.hlines(np.arange(0.5, down - 1), -0.5, grid.shape[1] - 0.5, colors="white", linewidth=2.5)      # row gaps
    handles = [Patch(color="#000000", label=f"rank {rank}" + ("" if per_gpu else "'s machine"))]
    for k, (name, group) in enumerate(zip(names, groups)):
        colour, marker = _DIM_STYLES[k]
        cells = sorted({unit(r) for r in group if r != rank} - ({unit(rank)} if not per_gpu else set()))
        ax.scatter([place[1](u) + (0 if per_gpu else 0.3 * (k - 1)) for u in cells], [place[0](u) for u in cells],
                   marker=marker, s=24 if per_gpu else 8, facecolor="white", edgecolor="black", linewidth=0.4)
        spans = len({r // gpus_per_node for r in group})
        handles.append((Patch(color=colour), ax.scatter([], [], marker=marker, facecolor="white", edgecolor="black",
                                                        label=f'its "{name}" group: {_plural(len(group), "rank")} on '
                                                              f'{_plural(spans, "machine")}')))
    step = math.ceil(down / 16)                                                           # at most 16 row labels
    for row in range(0, down, step):
        ax.text(-0.8, row, f"machines {row * across}-{min(machines, (row + 1) * across) - 1}", ha="right",
                va="center", fontsize=7)
    ax.set_axis_off()
    ax.legend(handles=handles, labels=[h.get_label() if not isinstance(h, tuple) else h[1].get_label() for h in handles],
              handler_map={tuple: HandlerTuple(ndivide=1)}, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
              fontsize=7, frameon=False)
    cells = (f"each row holds {_plural(across, 'machine')} of {gpus_per_node} cells, one cell per GPU" if per_gpu
             else f"one cell per machine, {across} machines per row")
    ax.set_title(f"{_plural(n, 'rank')} = " + " × ".join(f"{name} {s}" for name, s in zip(names, shape))
                 + f" on {_plural(machines, 'machine')} of {gpus_per_node} GPUs:\n{cells}", fontsize=8)
    return fig
