"""Pictures of what a collective did, drawn from the tensors the ranks really held.

A collective is easiest to understand as a before/after picture: one row per
rank, the rank's tensor before the call on the left and after it on the
right. :func:`plot_ranks` draws that picture from values the ranks returned
(``ddpkit.launch`` hands them back in rank order), so the figure cannot
disagree with what ran. Every number is written in its cell, and one colour
scale is shared by the whole figure: a value that travelled from rank 2 to
rank 0 keeps its colour, so you can follow it with your eye (``log=True``
makes the scale logarithmic, for values such as products that span orders of
magnitude). Objects (``*_object`` collectives) are written as wrapped text.

:func:`plot_bandwidth` draws a bandwidth sweep from :func:`ddpkit.collective_bandwidth`:
time per call and bus bandwidth against the size, one curve per world size,
with the single-process copy as the dashed reference; the x axis says what the
size means for the op (the tensor per rank for all_reduce, the whole gathered
output for all_gather, ...), following ``nccl-tests``.

Both build a :class:`matplotlib.figure.Figure` directly (``Figure()`` and
``fig.subplots``), never through pyplot: pyplot keeps global state (the
"current figure") that races when an experiment's button callback draws on
another thread, so these functions are safe inside ``ddpkit.experiment``.
Nothing needs closing; in a notebook, show one with ``display(fig)`` (after
``%matplotlib inline``, which registers the PNG display of any Figure), or
return it from an experiment's ``run``.
Chapter 03 (``notebooks/03_collectives.ipynb``) uses this module (and
:func:`plot_ring_steps`, a ring all-reduce drawn step by step); chapter 01
draws its cluster layouts with :func:`plot_cluster`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence


def _as_grid(value: Any):
    """A 2-D float array for a tensor, number, list of tensors; None when the value is not numeric."""
    import numpy as np
    import torch

    if value is None:
        return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        parts = [v.detach().reshape(-1).double().numpy() for v in value]
        if all(p.size == 1 for p in parts):
            return np.concatenate(parts)[None, :]  # a list of single values: one row
        if len({p.size for p in parts}) == 1:
            return np.stack(parts)  # e.g. all_gather's list: one row per source rank
        value = torch.cat([torch.as_tensor(p) for p in parts])
    if isinstance(value, torch.Tensor):
        array = value.detach().double().numpy()
    else:
        try:
            array = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            return None
    if array.ndim > 2:
        array = array.reshape(array.shape[0], -1)
    return np.atleast_2d(array)


def _fmt(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() and abs(x) < 1e6 else f"{x:.3g}"


_CELL_W, _CELL_H = 0.55, 0.42  # inches per drawn number
_CHAR_W, _LINE_H = 0.068, 0.17  # inches per character and per line of 8-point text
_TEXT_CHARS = 36  # objects' text is wrapped to this many characters per line
_TITLE_CHAR_W = 0.1  # inches per character of the 12-point title


def _text_lines(value: Any) -> list[str]:
    """An object's repr wrapped into short lines, so it stays inside its box."""
    import textwrap

    text = "-" if value is None else repr(value)
    return textwrap.wrap(text, _TEXT_CHARS, break_on_hyphens=False) or [""]


def plot_ranks(
    before: Sequence[Any],
    after: Sequence[Any] | None = None,
    title: str | None = None,
    labels: tuple[str, str] = ("before", "after"),
    cmap: str = "viridis",
    log: bool = False,
):
    """One row per rank: its value ``before`` the collective and ``after`` it.

    ``before[r]``/``after[r]`` is what rank ``r`` held: a tensor (1-D or 2-D),
    a list of equally long tensors (drawn one per row, e.g. ``all_gather``'s
    output; single values side by side, e.g. ``scatter``'s input), a number,
    ``None`` (drawn as an empty, dashed box: the rank had no such buffer) or
    any other object (its ``repr`` written as text, wrapped to fit its box,
    for the ``*_object`` collectives). Pass ``after=None`` for a single column.

    One colour scale is shared by the whole figure. ``log=True`` makes it
    logarithmic (all values must be positive): use it when the values span
    orders of magnitude, such as the result of ``all_reduce(PRODUCT)``, where
    a linear scale paints everything but the largest value the same colour.

    It builds a :class:`matplotlib.figure.Figure` without pyplot, so it is
    safe in an experiment's callback thread; nothing needs closing.

    >>> import torch
    >>> fig = plot_ranks([torch.tensor([1., 2.]), torch.tensor([3., 4.])],
    ...                  [torch.tensor([4., 6.])] * 2, title="all_reduce(SUM)")
    >>> len(fig.axes), fig.axes[0].get_ylabel(), fig.axes[1].get_title()
    (4, 'rank 0', 'after')
    """
    import textwrap

    import numpy as np
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure

    columns = [list(before)] if after is None else [list(before), list(after)]
    if after is not None and len(columns[0]) != len(columns[1]):
        raise ValueError(f"before has {len(columns[0])} ranks but after has {len(columns[1])}")
    world_size = len(columns[0])
    if world_size == 0:
        raise ValueError("nothing to draw: before is empty")
    grids = [[_as_grid(v) for v in column] for column in columns]
    numbers = [g for column in grids for g in column if g is not None and g.size]
    texts = [_text_lines(v) for c, column in enumerate(columns) for r, v in enumerate(column) if grids[c][r] is None]
    low = min((float(np.min(g)) for g in numbers), default=0.0)
    high = max((float(np.max(g)) for g in numbers), default=1.0)
    if log:
        if numbers and low <= 0:
            raise ValueError(f"log=True needs positive values, but the smallest is {low:g}; use log=False")
        norm = LogNorm(vmin=low, vmax=high if high > low else low * 10)
    else:
        norm = Normalize(vmin=low, vmax=high if high > low else low + 1)
    height = max((g.shape[0] for g in numbers), default=1)
    # each column is as wide as its own widest value: scatter's "after" is narrower than its "before"
    widths = [max((g.shape[1] for g in column if g is not None and g.size), default=1) for column in grids]
    panel_ws = []
    for c, column in enumerate(columns):
        chars = max((len(line) for r, v in enumerate(column) if grids[c][r] is None for line in _text_lines(v)),
                    default=0)
        panel_ws.append(max(_CELL_W * widths[c], _CHAR_W * chars + 0.2))
    lines = max((len(lines) for lines in texts), default=0)
    panel_h = max(_CELL_H * height, _LINE_H * lines + 0.12)
    fig_w = max(0.9 + sum(w + 0.15 for w in panel_ws), 3.5)
    title_lines = textwrap.wrap(title, max(20, int((fig_w - 0.3) / _TITLE_CHAR_W))) if title else []
    fig = Figure(
        figsize=(fig_w, 0.3 + 0.25 * len(title_lines) + 0.25 * bool(title) + (panel_h + 0.12) * world_size),
        layout="constrained",
    )
    axes = fig.subplots(world_size, len(columns), squeeze=False, gridspec_kw={"width_ratios": panel_ws})
    for c, column in enumerate(columns):
        for r, value in enumerate(column):
            ax, grid = axes[r][c], grids[c][r]
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(f"rank {r}", rotation=0, ha="right", va="center")
            if r == 0 and len(columns) > 1:
                ax.set_title(labels[c])
            if grid is None:
                ax.set_xlim(0, 1)
                ax.set_ylim(0, 1)
                ax.text(0.5, 0.5, "\n".join(_text_lines(value)), ha="center", va="center", fontsize=8)
                if value is None:
                    for spine in ax.spines.values():
                        spine.set_linestyle("--")
                continue
            ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", extent=(0, grid.shape[1], grid.shape[0], 0))
            ax.set_xlim(0, widths[c])
            ax.set_ylim(height, 0)  # one cell is the same size in every panel
            for spine in ax.spines.values():
                spine.set_visible(False)
            for (i, j), x in np.ndenumerate(grid):
                ax.text(j + 0.5, i + 0.5, _fmt(x), ha="center", va="center", fontsize=8,
                        color="black" if float(norm(x)) > 0.5 else "white")
    if title:
        fig.suptitle("\n".join(title_lines))  # wrapped to the figure's width, never cut off
    return fig


def _size_formatter():
    from matplotlib.ticker import FuncFormatter

    def fmt(x, _pos):
        for unit in ("B", "KiB", "MiB", "GiB"):
            if x < 1024 or unit == "GiB":
                return f"{x:g} {unit}"
            x /= 1024
        return ""  # pragma: no cover

    return FuncFormatter(fmt)


def plot_bandwidth(rows: Iterable[Any], reference: Iterable[Any] = (), title: str | None = None):
    """Time per call and bus bandwidth against size, one line per (op, world size).

    ``rows`` are :class:`ddpkit.BandwidthRow` (or dicts with the same keys:
    ``op``, ``world_size``, ``nbytes``, ``seconds``, ``busbw``);
    ``reference`` rows (the copy) are drawn dashed; for the copy the right
    panel's value is simply bytes copied per second (the axis label says so). The
    x axis says what the size is for the op drawn (:func:`ddpkit.size_meaning`),
    its ticks in KiB / MiB: the tensor
    each rank hands in for all_reduce, but the whole gathered output for
    all_gather, following ``nccl-tests``. It builds a
    :class:`matplotlib.figure.Figure` without pyplot (safe in a callback).

    >>> from ddpkit import BandwidthRow
    >>> rows = [BandwidthRow("all_reduce", 2, n, n / 1e9) for n in (1024, 4096)]
    >>> fig = plot_bandwidth(rows, [BandwidthRow("copy", 1, n, n / 2e10) for n in (1024, 4096)])
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['time per call (us)', 'bus bandwidth (GB/s)\\nfor the copy: GB copied per s']
    >>> fig.axes[0].get_xlabel()
    'size: the tensor each rank reduces'
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    from ._bench import size_meaning

    def field(row, name):
        return row[name] if isinstance(row, dict) else getattr(row, name)

    rows, reference = list(rows), list(reference)
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_time, ax_bw = fig.subplots(1, 2)
    for dashed, group in ((False, rows), (True, reference)):
        curves: dict[tuple, list] = {}
        for row in group:
            curves.setdefault((field(row, "op"), field(row, "world_size")), []).append(row)
        for (op, world_size), curve in curves.items():
            curve.sort(key=lambda row: field(row, "nbytes"))
            x = [field(row, "nbytes") for row in curve]
            label = "copy, 1 process" if op == "copy" else f"{op}, {world_size} ranks"
            style = dict(linestyle="--" if dashed else "-", marker="o", markersize=3, label=label)
            ax_time.plot(x, [field(row, "seconds") * 1e6 for row in curve], **style)
            ax_bw.plot(x, [field(row, "busbw") for row in curve], **style)
    ops = list(dict.fromkeys(field(row, "op") for row in rows)) or ["copy"]
    xlabel = f"size: {size_meaning(ops[0])}" if len(ops) == 1 else "size (its meaning per op: ddpkit.size_meaning)"
    sizes = sorted({field(row, "nbytes") for row in rows + reference})
    bw_label = "bus bandwidth (GB/s)" + ("\nfor the copy: GB copied per s" if reference else "")
    for ax, ylabel in ((ax_time, "time per call (us)"), (ax_bw, bw_label)):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)  # one tick per measured size, written as KiB / MiB
        ax.xaxis.set_major_formatter(_size_formatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_time.set_title("time per call (lower is faster)")
    ax_bw.set_title("bus bandwidth (higher is faster)")
    if title:
        fig.suptitle(title)
    return fig


def plot_cluster(rows: Sequence[Any], highlight: str = "RANK"):
    """One box per machine (node), one square per process in it; orange where ``highlight`` is 0.

    ``rows`` are the ranks' variables, one dict per rank with the keys ``RANK``,
    ``LOCAL_RANK``, ``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE``
    (chapter 01's ``where_am_i`` returns them). Each square is drawn at its
    node's row and its ``LOCAL_RANK``'s column and labelled with both ranks, so
    the picture shows how a job's processes are numbered. ``highlight`` names
    the variable whose value 0 marks a process orange: ``"RANK"`` (once per
    job) or ``"LOCAL_RANK"`` (once per machine). It builds a
    :class:`matplotlib.figure.Figure` without pyplot (safe in a callback).

    >>> rows = [{"RANK": r, "LOCAL_RANK": r % 2, "GROUP_RANK": r // 2, "LOCAL_WORLD_SIZE": 2,
    ...          "WORLD_SIZE": 4} for r in range(4)]
    >>> fig = plot_cluster(rows, highlight="LOCAL_RANK")
    >>> fig.axes[0].get_title().splitlines()
    ['2 node(s) x 2 process(es) = world size 4', 'orange: the process(es) with LOCAL_RANK == 0']
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows = list(rows)
    if not rows:
        raise ValueError("nothing to draw: rows is empty")
    per_node = rows[0]["LOCAL_WORLD_SIZE"]
    nnodes = rows[0]["WORLD_SIZE"] // per_node
    fig = Figure(figsize=(max(1.4 * per_node + 2.0, 5.0), 1.3 * nnodes + 0.9))
    ax = fig.add_subplot()
    for node in range(nnodes):
        y = -node * 1.4
        ax.add_patch(Rectangle((-0.1, y - 0.1), per_node + 0.2, 1.2, fill=False, lw=1.5))
        ax.text(-0.25, y + 0.5, f"node {node}\nGROUP_RANK {node}", ha="right", va="center", fontsize=9)
    for r in rows:
        x, y = r["LOCAL_RANK"], -r["GROUP_RANK"] * 1.4
        color = "tab:orange" if r[highlight] == 0 else "tab:blue"
        ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, color=color, alpha=0.35))
        ax.text(x + 0.5, y + 0.5, f"RANK {r['RANK']}\nLOCAL_RANK {r['LOCAL_RANK']}",
                ha="center", va="center", fontsize=8)
    ax.set_xlim(-1.6, per_node + 0.2)
    ax.set_ylim(-(nnodes - 1) * 1.4 - 0.2, 1.2)
    ax.set_axis_off()
    ax.set_title(f"{nnodes} node(s) x {per_node} process(es) = world size {nnodes * per_node}\n"
                 f"orange: the process(es) with {highlight} == 0", fontsize=10)
    return fig


def plot_digits(x: Any, y: Any, count: int = 10):
    """The first ``count`` digit images of ``x`` (rows of 64 pixels, 8 x 8), each titled with its label in ``y``.

    Chapter 04 shows the training data with it before training on it. It
    builds a :class:`matplotlib.figure.Figure` without pyplot.

    >>> import ddpkit
    >>> digits = ddpkit.load_digits()
    >>> fig = plot_digits(digits.x_train, digits.y_train, count=3)
    >>> [ax.get_title() for ax in fig.axes] == [str(int(v)) for v in digits.y_train[:3]]
    True
    """
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(count, 1.3), layout="constrained")
    axes = fig.subplots(1, count, squeeze=False)[0]
    for i, ax in enumerate(axes):
        pixels = x[i].detach().cpu().numpy() if hasattr(x[i], "detach") else np.asarray(x[i])
        ax.imshow(pixels.reshape(8, 8), cmap="gray_r")
        ax.set_title(str(int(y[i])))
        ax.axis("off")
    return fig


def plot_runs(history: Sequence[tuple[str, Mapping[str, Any]]], title: str | None = None, tolerance: float = 1e-4):
    """Loss curves and throughput bars of training runs: ``[(label, result), ...]``.

    Each ``result`` has ``"losses"`` (one value per epoch) and
    ``"samples_per_s"``. Curves that agree within ``tolerance`` at every
    epoch are drawn once, labelled ``"a = b (identical)"``, so identical
    runs do not hide each other; the throughput bars share one linear axis
    from 0, with each value written beside its bar. It builds a
    :class:`matplotlib.figure.Figure` without pyplot (safe in an experiment's
    callback thread).

    >>> run = {"losses": [1.0, 0.5, 0.2], "samples_per_s": 1000.0}
    >>> fig = plot_runs([("1 rank", run), ("2 ranks", dict(run, samples_per_s=1500.0))], title="same curve")
    >>> [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    ['1 rank = 2 ranks (identical)']
    >>> [t.get_text() for t in fig.axes[1].texts]
    ['1,000', '1,500']
    """
    from matplotlib.figure import Figure

    history = list(history)
    if not history:
        raise ValueError("nothing to draw: history is empty")
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    groups: list[tuple[list[str], list[float]]] = []  # curves that agree share a line
    for label, result in history:
        losses = list(result["losses"])
        for labels, shared in groups:
            if len(shared) == len(losses) and max(abs(a - b) for a, b in zip(shared, losses)) < tolerance:
                labels.append(label)
                break
        else:
            groups.append(([label], losses))
    for labels, losses in groups:
        name = labels[0] if len(labels) == 1 else " = ".join(labels) + " (identical)"
        left.plot(range(1, len(losses) + 1), losses, marker="o", markersize=3, label=name)
    left.set_xlabel("epoch")
    left.set_ylabel("training loss (log scale)")
    left.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title("training loss per epoch", fontsize=10)
    labels = [label for label, _ in history]
    rates = [float(result["samples_per_s"]) for _, result in history]
    bars = right.barh(labels, rates, height=0.5, color="C2")  # a linear axis from 0: lengths compare
    right.bar_label(bars, labels=[f"{v:,.0f}" for v in rates], padding=3, fontsize=8)
    right.set_xlim(0, max(rates) * 1.3)
    right.set_ylim(max(3, len(rates)) - 0.5, -0.5)  # top down, in fixed slots
    right.set_xlabel("training samples per second")
    right.tick_params(axis="y", labelsize=8)
    right.set_title("throughput", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_rendezvous(to_store: Sequence[int], pairs: dict, host_rank: int = 0, everywhere: bool = True,
                    title: str | None = None):
    """Who talks to whom after ``init_process_group``: the store (left) and gloo's mesh (right).

    ``to_store[r]`` is how many connections rank ``r`` has open to the store's
    port; ``pairs`` maps a pair of ranks ``(a, b)``, ``a < b``, to the number
    of direct connections between them (chapter 02 counts both with
    ``psutil`` in a real run). The left panel draws the store's server inside
    the process of ``host_rank`` (``everywhere`` says whether it is bound to
    all interfaces) and every rank, the host's own client included, connecting
    to it; the right panel draws the ranks on a circle and one line per pair,
    labelled with its count. It builds a :class:`matplotlib.figure.Figure`
    without pyplot (safe in a callback).

    >>> fig = plot_rendezvous([1, 1, 1], {(0, 1): 1, (0, 2): 1, (1, 2): 1})
    >>> [ax.get_title() for ax in fig.axes]
    ['rendezvous: connections to the store, per rank', 'gloo: TCP connections per pair of ranks']
    """
    import math

    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    n = len(to_store)
    if not 0 <= host_rank < n:
        raise ValueError(f"host_rank {host_rank} is not one of the {n} ranks")
    fig = Figure(figsize=(10, 4.2))
    ax_store, ax_mesh = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for ax in (ax_store, ax_mesh):
        ax.set_xlim(0, 6)
        ax.set_ylim(0, 4)
        ax.axis("off")
    box = dict(boxstyle="round,pad=0.05")
    # the host's process, the store's server inside it, the host's own client below
    ax_store.add_patch(FancyBboxPatch((0.2, 0.3), 2.8, 3.4, color="lightsteelblue", **box))
    ax_store.text(1.6, 3.45, f"rank {host_rank}'s process", ha="center", va="center", fontsize=9)
    ax_store.add_patch(FancyBboxPatch((0.45, 2.05), 2.3, 1.0, color="moccasin", **box))
    bound = "all interfaces" if everywhere else "one address"
    ax_store.text(1.6, 2.55, f"TCPStore server\non MASTER_PORT\nbound to {bound}", ha="center", va="center",
                  fontsize=8)
    others = [r for r in range(n) if r != host_rank]
    places = {host_rank: (1.6, 0.85)}
    for k, r in enumerate(others):
        places[r] = (4.7, 3.2 - 2.6 * k / (len(others) - 1)) if len(others) > 1 else (4.7, 2.0)
    for r, (x, y) in places.items():
        ax_store.add_patch(FancyBboxPatch((x - 0.65, y - 0.28), 1.3, 0.56, zorder=2,
                                          color="white" if r == host_rank else "lightsteelblue", **box))
        ax_store.text(x, y, f"rank {r}" + (" client" if r == host_rank else ""), ha="center", va="center",
                      fontsize=9, zorder=3)
        (tx, ty), (sx, sy) = ((1.6, 2.0), (x, y + 0.3)) if r == host_rank else ((2.8, 2.55), (x - 0.7, y))
        ax_store.annotate("", xy=(tx, ty), xytext=(sx, sy), arrowprops=dict(arrowstyle="->", color="gray"))
        ax_store.text((sx + tx) / 2 + 0.12, (sy + ty) / 2 + 0.08, f"{to_store[r]}", fontsize=9, color="dimgray")
    ax_store.set_title("rendezvous: connections to the store, per rank", fontsize=10)
    angle = [math.pi / 2 + 2 * math.pi * r / n for r in range(n)]
    pos = {r: (3 + 1.6 * math.cos(angle[r]), 2 + 1.4 * math.sin(angle[r])) for r in range(n)}
    for (a, b), count in sorted(pairs.items()):
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax_mesh.plot([xa, xb], [ya, yb], color="tab:blue", linewidth=1 + count, zorder=1)
        ax_mesh.text((xa + xb) / 2, (ya + yb) / 2 + 0.12, f"{count}", color="tab:blue", fontsize=9, ha="center")
    for r, (x, y) in pos.items():
        ax_mesh.add_patch(FancyBboxPatch((x - 0.45, y - 0.3), 0.9, 0.6, color="lightsteelblue", zorder=2, **box))
        ax_mesh.text(x, y, f"rank {r}", ha="center", va="center", fontsize=9, zorder=3)
    ax_mesh.set_title("gloo: TCP connections per pair of ranks", fontsize=10)
    fig.suptitle(title or f"Who connects to whom: {n} ranks", fontsize=11)
    return fig


def plot_arrivals(rows: Sequence[Sequence[Any]], timeout: float | None = None, title: str | None = None):
    """A rendezvous as a timeline: when each rank arrived, how long it waited, and whether it joined.

    ``rows[r]`` is rank ``r``'s ``(started, called, left, outcome)``: when the
    process started, when it called ``init_process_group`` and when it got
    out (seconds on one clock; ``called`` and ``left`` are ``None`` for a rank
    that never called it), and a string saying what happened (a rank whose
    outcome starts with ``"joined"`` joined the group). Each rank's row shows
    its lateness in gray, then its wait inside ``init_process_group`` in blue
    (it joined) or red (it gave up), and a dotted mark ``timeout`` seconds
    after it called. Times are drawn from the earliest start. It builds a
    :class:`matplotlib.figure.Figure` without pyplot (safe in a callback).

    >>> rows = [(0.0, 0.0, 1.1, "joined"), (0.0, 1.0, 1.1, "joined"), (0.0, None, None, "never came")]
    >>> fig = plot_arrivals(rows, timeout=2)
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()], [t.get_text() for t in fig.axes[0].texts]
    (['rank 2', 'rank 1', 'rank 0'], ['  never arrives'])
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = [tuple(row) for row in rows]
    if not rows:
        raise ValueError("nothing to draw: rows is empty")
    origin = min(row[0] for row in rows)
    fig = Figure(figsize=(8.5, 0.6 * len(rows) + 1.8), layout="constrained")
    ax = fig.add_subplot()
    shown = set()
    for rank, (started, called, left, outcome) in enumerate(rows):
        y, started = len(rows) - 1 - rank, started - origin
        if called is None:
            ax.text(started, y, "  never arrives", va="center", color="dimgray")
            continue
        called, left = called - origin, (called if left is None else left) - origin
        if called - started > 0.05:
            ax.barh(y, called - started, left=started, color="lightgray", height=0.5)
            shown.add("late")
        joined = str(outcome).startswith("joined")
        ax.barh(y, max(left - called, 0.02), left=called, color="tab:blue" if joined else "tab:red", height=0.5)
        shown.add("joined" if joined else "gave up")
        if timeout is not None:
            ax.plot([called + timeout] * 2, [y - 0.35, y + 0.35], color="black", linestyle=":")
            shown.add("timeout")
    ax.set_yticks(range(len(rows)), [f"rank {r}" for r in reversed(range(len(rows)))])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("seconds since the first rank started")
    ax.set_xlim(left=0)
    legend = {"late": Patch(color="lightgray", label="not there yet (late)"),
              "joined": Patch(color="tab:blue", label="in init_process_group, joined"),
              "gave up": Patch(color="tab:red", label="in init_process_group, gave up"),
              "timeout": Line2D([], [], color="black", linestyle=":", label="its timeout")}
    fig.legend(handles=[h for k, h in legend.items() if k in shown], loc="outside lower center", ncol=4,
               fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_ring_steps(histories: Sequence[Sequence[tuple]], title: str | None = None):
    """A ring all-reduce as the ranks recorded it: reduce-scatter on top, all-gather below.

    ``histories[r]`` is rank ``r``'s record, ``2(n-1) + 1`` entries of
    ``(step name, index of the chunk just received or None, the rank's whole
    tensor after the step)``: the start, then the ``n-1`` reduce-scatter
    steps, then the ``n-1`` all-gather steps (chapter 03's ``ring_all_reduce``
    writes exactly this when given a ``history`` list). Each half is one
    picture: one row per rank, one panel per step, one cell per chunk with its
    value written in it (chunk indices under the last row); the chunk the rank
    just received is outlined in red. One colour scale is shared by the whole
    figure, so a sum keeps its colour as it travels. It builds a
    :class:`matplotlib.figure.Figure` without pyplot (safe in an experiment's
    callback).

    >>> import torch
    >>> start = [("start", None, torch.tensor([1., 2.])), ("start", None, torch.tensor([3., 4.]))]
    >>> done = [("reduce-scatter 1", 1, torch.tensor([1., 6.])), ("reduce-scatter 1", 0, torch.tensor([4., 4.]))]
    >>> gathered = [("all-gather 1", 0, torch.tensor([4., 6.])), ("all-gather 1", 1, torch.tensor([4., 6.]))]
    >>> fig = plot_ring_steps([[s, d, g] for s, d, g in zip(start, done, gathered)])
    >>> [ax.get_title().split(":")[0] for ax in fig.axes], len(fig.axes[1].patches)
    (['reduce-scatter', 'all-gather'], 2)
    """
    import numpy as np
    import torch
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    n = len(histories)
    if n < 2 or any(len(history) != 2 * n - 1 for history in histories):
        raise ValueError(f"expected one record of 2(n-1)+1 = {2 * n - 1} steps per rank, for n = {n} ranks")
    states = [[torch.as_tensor(state, dtype=torch.float64).reshape(-1).numpy() for _, _, state in h]
              for h in histories]
    width = len(states[0][0])
    low = min(float(v.min()) for row in states for v in row)
    high = max(float(v.max()) for row in states for v in row)
    high = high if high > low else low + 1
    halves = [  # (caption, [(column title, step index in the history, outline the received chunk?)])
        ("reduce-scatter: each rank adds the chunk it receives (red) into its own copy",
         [("start", 0, False)] + [(f"step {s}", s, True) for s in range(1, n)]),
        ("all-gather: each rank overwrites its copy with the finished chunk it receives (red)",
         [("after\nreduce-scatter", n - 1, False)] + [(f"step {s}", n - 1 + s, True) for s in range(1, n)]),
    ]
    gap = 0.6  # between two steps' panels, in chunk widths
    span = n * width + (n - 1) * gap
    fig = Figure(figsize=(1.2 + 0.55 * span, 2 * (0.9 + 0.45 * n)), layout="constrained")
    cmap = colormaps["viridis"].with_extremes(bad="white")
    for ax, (caption, columns) in zip(fig.subplots(2, 1), halves):
        for col, (column_title, step, outline) in enumerate(columns):
            left = col * (width + gap)
            grid = np.array([states[rank][step] for rank in range(n)])
            ax.imshow(grid, cmap=cmap, vmin=low, vmax=high, aspect="auto",
                      extent=(left, left + width, n, 0))
            ax.text(left + width / 2, -0.15, column_title, ha="center", va="bottom", fontsize=10)
            for rank in range(n):
                for i, v in enumerate(grid[rank]):
                    ax.text(left + i + 0.5, rank + 0.5, _fmt(v), ha="center", va="center", fontsize=10,
                            color="black" if v > (low + high) / 2 else "white")
                received = histories[rank][step][1]
                if outline and received is not None:
                    ax.add_patch(Rectangle((left + received + 0.05, rank + 0.07), 0.9, 0.86, fill=False,
                                           edgecolor="red", linewidth=2.5))
        ax.set_xlim(-0.1, span + 0.1)
        ax.set_ylim(n + 0.05, -0.05)
        ax.set_xticks([col * (width + gap) + i + 0.5 for col in range(n) for i in range(width)],
                      [str(i) for _ in range(n) for i in range(width)], fontsize=9)
        ax.set_xlabel("chunk", fontsize=9)
        ax.set_yticks([rank + 0.5 for rank in range(n)], [f"rank {rank}" for rank in range(n)])
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(caption, fontsize=11, pad=22)
    fig.suptitle(title or f"ring all-reduce with {n} ranks, as the ranks recorded it", fontsize=12)
    return fig


def plot_holdings(cases: Sequence[tuple[str, Sequence[Any]]], shape: tuple[int, int], title: str | None = None):
    """Which rank holds which entries of a matrix: one row per case, one panel per rank.

    A ``DTensor``'s placements say which block of the global tensor each rank
    holds; this draws it from what the ranks really held. ``cases`` is a list
    of ``(label, holdings)``, and ``holdings`` has one entry per rank, in rank
    order: ``(coordinate, positions, values, partial)``, that is, the rank's
    coordinate in the device mesh, the flat indices (``row * columns + column``)
    of the global entries its local tensor holds, the local tensor itself (the
    same shape as ``positions``), and whether it is a ``Partial`` summand (drawn
    hatched, its zeros faded). Each panel is titled with its rank and
    coordinate ("rank 1 at (0, 1)"), each row with its label. Distribute ``torch.arange(rows * columns)`` with
    the same placements to get ``positions``: each local entry is then its own
    flat index. A rank that holds nothing (an uneven ``Shard``) says so.

    Every panel is drawn in one set of axes (many small axes are slow to lay
    out). It builds a :class:`matplotlib.figure.Figure` without pyplot, so it is
    safe in an experiment's callback thread; nothing needs closing.
    Chapter 08 (``notebooks/08_tensor_parallel.ipynb``) uses it.

    >>> import torch
    >>> whole = torch.arange(6).reshape(2, 3)                     # Shard(0) on 2 ranks: one row each
    >>> held = [((r,), whole[r:r + 1], whole[r:r + 1], False) for r in range(2)]
    >>> fig = plot_holdings([("Shard(0)", held)], (2, 3))
    >>> [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("rank")]
    ['rank 0 at (0,)\\nlocal (1, 3)', 'rank 1 at (1,)\\nlocal (1, 3)']
    """
    from matplotlib.collections import PatchCollection
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows, cols = shape
    if not cases:
        raise ValueError("nothing to draw: cases is empty")
    width = max(len(held) for _, held in cases)
    gap_x, gap_y = 0.6, 1.6                      # between panels, in cells; gap_y leaves room for the titles
    longest = max(len(line) for label, _ in cases for line in str(label).splitlines() or [""])
    left = 0.25 + 0.08 * longest                 # inches for the row labels (9-point text)
    panels_w, panels_h = 0.32 * width * (cols + gap_x), 0.32 * len(cases) * (rows + gap_y)
    fig = Figure(figsize=(left + panels_w + 0.1, 0.45 + panels_h))
    ax = fig.add_axes((left / (left + panels_w + 0.1), 0.02, panels_w / (left + panels_w + 0.1), 0.9))
    cells: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}   # hatched or not: patches, colours
    frames = []
    for row, (label, held) in enumerate(cases):
        top = row * (rows + gap_y) + gap_y
        for rank, (coordinate, positions, values, partial) in enumerate(held):
            if tuple(positions.shape) != tuple(values.shape):
                raise ValueError(f"{label}, rank {rank}: positions {tuple(positions.shape)} "
                                 f"but values {tuple(values.shape)}")
            x0 = rank * (cols + gap_x)
            frames.append(Rectangle((x0, top), cols, rows))
            for position, value in zip(positions.flatten().tolist(), values.flatten().tolist()):
                r, c = divmod(int(position), cols)
                faded = partial and value == 0
                cells[bool(partial)][0].append(Rectangle((x0 + c, top + r), 1, 1))
                cells[bool(partial)][1].append(to_rgba(f"C{rank}", 0.25 if faded else 0.75))
                ax.text(x0 + c + 0.5, top + r + 0.5, _fmt(value), ha="center", va="center", fontsize=7,
                        color="dimgrey" if faded else "black")
            if values.numel() == 0:
                ax.text(x0 + cols / 2, top + rows / 2, "holds nothing", ha="center", va="center", fontsize=7,
                        color="dimgrey")
            ax.text(x0 + cols / 2, top - 0.15, f"rank {rank} at {tuple(coordinate)}\nlocal {tuple(values.shape)}",
                    ha="center", va="bottom", fontsize=7)
        ax.text(-0.4, top + rows / 2, label, ha="right", va="center", fontsize=9, fontweight="bold")
    for hatched, (patches, colours) in cells.items():
        if patches:
            ax.add_collection(PatchCollection(patches, facecolors=colours, edgecolors="white", linewidths=0.8,
                                              hatch="///" if hatched else None))
    ax.add_collection(PatchCollection(frames, facecolors="none", edgecolors="black", linewidths=0.8))
    ax.set_xlim(-0.1, width * (cols + gap_x) - gap_x + 0.1)
    ax.set_ylim(len(cases) * (rows + gap_y) + 0.1, -0.1)
    ax.set_aspect("equal")
    ax.set_axis_off()
    fig.suptitle(title or f"which rank holds which entries of the {rows} x {cols} matrix "
                 "(hatched: a Partial summand)", fontsize=8)
    return fig


def plot_partition(cases: Sequence[tuple[str, Sequence[Sequence[int]]]], n: int):
    """Which dataset indices each rank's sampler yields: one row of boxes per rank, one panel per case.

    ``cases`` is a list of ``(title, parts)``, where ``parts[r]`` lists the indices rank ``r``
    got, in order, from a ``DistributedSampler`` (or any sampler that strides one padded list)
    over a dataset of ``n`` samples. A box is one sample and its number the dataset index,
    placed at its position in the rank's share (the axis on top); an orange, hatched box is a
    padding duplicate (its slot ``position * world + rank`` in the padded list is ``>= n``).
    Below a line, a grey row lists the indices no rank got (dropped by ``drop_last=True``):
    a plain list, not positions. Panels sit two to a row when they are narrow; the legend
    is on the right. Built without pyplot (safe in an experiment's callback).
    Chapter 05 (``notebooks/05_samplers.ipynb``) uses it.

    >>> fig = plot_partition([("10 samples, 4 ranks", [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]])], 10)
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ['rank 0', 'rank 1', 'rank 2', 'rank 3', 'dropped']
    >>> sum(1 for p in fig.axes[0].patches if p.get_hatch())   # items 0 and 1, padded
    2
    """
    import math

    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    if not cases:
        raise ValueError("plot_partition needs at least one (title, parts) case; got an empty list")
    sample, padding, dropped_colour = "#5b9bd5", "#f4a259", "lightgrey"
    panels = []
    for title, parts in cases:
        seen = {i for part in parts for i in part}
        dropped = [i for i in range(n) if i not in seen]
        panels.append((title, parts, dropped, max([len(part) for part in parts] + [len(dropped), 1])))
    widest = max(width for *_, width in panels)
    cols = 2 if len(panels) > 1 and widest <= 8 else 1
    grid_rows = math.ceil(len(panels) / cols)
    box = min(0.5, 7.0 / max(widest, 1))  # inches per box; wide shares shrink the boxes
    longest_title = max(len(line) for title, *_ in panels for line in title.splitlines())
    panel_width = max(0.8 + box * max(widest, 2), 0.075 * longest_title)
    title_lines = max(len(title.splitlines()) for title, *_ in panels)
    rows = [max(len(parts) for _, parts, *_ in panels[g * cols:(g + 1) * cols]) + 1.4 for g in range(grid_rows)]
    fig = Figure(figsize=(cols * panel_width + 2.2, grid_rows * (0.9 + 0.17 * title_lines) + 0.34 * sum(rows)),
                 layout="constrained")
    axes = fig.subplots(grid_rows, cols, squeeze=False, gridspec_kw={"height_ratios": rows}).flatten()
    fontsize = 8 if box >= 0.3 else 6
    for ax, (title, parts, dropped, _) in zip(axes, panels):
        world = len(parts)
        low = world + 0.4  # the dropped row sits below a gap and a line: it is a list, not positions
        for rank, part in enumerate(parts):
            for position, index in enumerate(part):
                padded = position * world + rank >= n
                ax.add_patch(Rectangle((position + 0.05, rank + 0.1), 0.9, 0.8, facecolor=padding if padded else sample,
                                       hatch="///" if padded else None, edgecolor="white" if padded else "none"))
                ax.text(position + 0.5, rank + 0.5, str(index), ha="center", va="center", fontsize=fontsize,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1} if padded else None)
            if not part:
                ax.text(0.1, rank + 0.5, "(nothing)", va="center", fontsize=8, color="dimgrey")
        ax.axhline(world + 0.2, color="darkgrey", linewidth=0.8)
        for k, index in enumerate(dropped):
            ax.add_patch(Rectangle((k + 0.05, low + 0.1), 0.9, 0.8, facecolor=dropped_colour))
            ax.text(k + 0.5, low + 0.5, str(index), ha="center", va="center", fontsize=fontsize, color="dimgrey")
        if not dropped:
            ax.text(0.1, low + 0.5, "(none)", va="center", fontsize=8, color="dimgrey")
        ax.set_xlim(0, max(widest, 2))  # one scale for every panel: boxes line up across panels
        ax.set_ylim(low + 1, 0)
        ax.set_yticks([r + 0.5 for r in range(world)] + [low + 0.5], [f"rank {r}" for r in range(world)] + ["dropped"],
                      fontsize=8)
        share = max(len(part) for part in parts)
        positions = range(0, share, max(1, math.ceil(share / 12)))
        ax.xaxis.tick_top()
        ax.xaxis.set_label_position("top")
        ax.set_xticks([p + 0.5 for p in positions], [str(p) for p in positions], fontsize=7, color="dimgrey")
        ax.set_xlabel("position in the rank's share", fontsize=7, color="dimgrey")
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(title, fontsize=9)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.legend(handles=[Patch(facecolor=sample, label="a sample\n(its dataset index)"),
                        Patch(facecolor=padding, hatch="///", edgecolor="white", label="padding duplicate"),
                        Patch(facecolor=dropped_colour, label="dropped:\ngiven to no rank")],
               loc="outside right upper", fontsize=8, frameon=False, title="DistributedSampler", title_fontsize=8)
    return fig


def number_attempts(events: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The events of a ``torchrun`` job, oldest first, each with ``"attempt"``: how often its rank had started before.

    ``events`` are dicts with at least ``"t"`` (a wall-clock time), ``"rank"``
    and ``"event"``; a ``"launched"`` event marks a worker process starting
    (chapter 06's ``train.py`` writes one JSON line per event). An attempt is
    counted per rank from its launches, not read from
    ``TORCHELASTIC_RESTART_COUNT``: with several agents, their restart counters
    need not agree. The events are copied, not changed.

    >>> events = [{"t": 0, "rank": 0, "event": "launched"}, {"t": 1, "rank": 0, "event": "crash"},
    ...           {"t": 2, "rank": 0, "event": "launched"}, {"t": 3, "rank": 0, "event": "finished"}]
    >>> [e["attempt"] for e in number_attempts(events)]
    [0, 0, 1, 1]
    """
    launches: dict[int, int] = {}
    numbered = []
    for e in sorted(events, key=lambda e: e["t"]):  # a new attempt starts after the old one's processes are gone
        if e["event"] == "launched":
            launches[e["rank"]] = launches.get(e["rank"], -1) + 1
        numbered.append({**e, "attempt": launches.get(e["rank"], 0)})
    return numbered


_ATTEMPT_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#8172B3"]


def plot_restarts(events: Iterable[Mapping[str, Any]], title: str | None = None):
    """The timeline of a ``torchrun`` job from its workers' events: seconds per rank (top), steps per attempt (bottom).

    ``events`` are dicts with ``"t"`` (wall-clock seconds), ``"rank"``,
    ``"event"`` and ``"step"``, as chapter 06's ``train.py`` writes them:
    ``launched`` (the process started), ``ready`` (process group up,
    checkpoint loaded), ``step`` (a step done), ``checkpoint`` (written before
    the given step), ``crash``, ``preempt`` (SIGTERM sent to the agent),
    ``stopped`` (stopped on SIGTERM) and ``finished``. Attempts are numbered
    with :func:`number_attempts`. The top panel draws each attempt of each rank
    as a bar in seconds, light while it starts up (launch to ready), dark
    while it trains; the bottom panel draws each attempt's training by step
    number: a tick per step, a triangle where a checkpoint was written, a red
    cross at a crash. It builds a :class:`matplotlib.figure.Figure` without
    pyplot (safe in an experiment's callback thread).

    >>> ev = [{"t": 0.0, "rank": 0, "event": "launched", "step": 0}, {"t": 2.0, "rank": 0, "event": "ready", "step": 0},
    ...       {"t": 2.1, "rank": 0, "event": "step", "step": 0}, {"t": 2.2, "rank": 0, "event": "crash", "step": 1}]
    >>> fig = plot_restarts(ev, title="one rank, one crash")
    >>> [ax.get_title() for ax in fig.axes]
    ['one rank, one crash', 'the training part of each attempt, by step']
    >>> [t.get_text() for t in fig.axes[1].get_yticklabels()]
    ['attempt 0, rank 0']
    """
    from matplotlib.figure import Figure

    events = number_attempts(events)
    if not events:
        raise ValueError("nothing to draw: events is empty")
    t0 = min(e["t"] for e in events)
    ranks = sorted({e["rank"] for e in events})
    rows = [(a, r) for a in sorted({e["attempt"] for e in events}) for r in ranks]
    fig = Figure(figsize=(9, 2.6 + 0.45 * (len(ranks) + len(rows))))
    grid = fig.add_gridspec(2, 1, height_ratios=[len(ranks) + 1, len(rows) + 1], hspace=0.8)
    whole, zoom = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    labelled: dict[Any, set] = {whole: set(), zoom: set()}

    def label(ax, name):  # each legend entry once per panel
        if name in labelled[ax]:
            return None
        labelled[ax].add(name)
        return name

    marks = [("crash", "X", "red", "crash"), ("preempt", "*", "orange", "SIGTERM sent to the agent"),
             ("stopped", "s", "black", "stopped on SIGTERM")]
    for attempt, rank in rows:
        mine = [e for e in events if e["rank"] == rank and e["attempt"] == attempt]
        if not mine:
            continue
        colour = _ATTEMPT_COLOURS[attempt % len(_ATTEMPT_COLOURS)]
        start, end = mine[0]["t"] - t0, max(e["t"] - t0 for e in mine)
        ready = next((e for e in mine if e["event"] == "ready"), None)
        ready_t = ready["t"] - t0 if ready else end
        whole.barh(-rank, ready_t - start, left=start, height=0.5, color=colour, alpha=0.3,
                   label=label(whole, f"attempt {attempt}: start-up (imports, process group, model)"))
        whole.barh(-rank, end - ready_t, left=ready_t, height=0.5, color=colour)
        for kind, marker, mcolour, name in marks:
            at = [e for e in mine if e["event"] == kind]
            if at:
                whole.plot([e["t"] - t0 for e in at], [-rank] * len(at), marker, color=mcolour, markersize=11,
                           linestyle="none", label=label(whole, name))
        if ready is None:
            continue
        # bottom: the same attempt by step number; a checkpoint "at step s" is written between steps s-1 and s
        y = -rows.index((attempt, rank))
        steps = [e["step"] for e in mine if e["event"] == "step"]
        saved = [e["step"] for e in mine if e["event"] == "checkpoint"]
        ends = [e["step"] - 0.5 for e in mine if e["event"] in ("crash", "preempt", "stopped")]
        left = ready["step"] - 0.5
        right = max([s + 0.5 for s in steps] + ends + [left])
        zoom.barh(y, right - left, left=left, height=0.5, color=colour, alpha=0.5)
        if steps:
            zoom.plot(steps, [y] * len(steps), "|", color="black", markersize=11, linestyle="none",
                      label=label(zoom, "a step done"))
        if saved:
            zoom.plot([s - 0.5 for s in saved], [y + 0.38] * len(saved), "v", color="white", markeredgecolor="black",
                      markersize=7, linestyle="none", label=label(zoom, "checkpoint written (above its row)"))
        for kind, marker, mcolour, name in marks:
            at = [e["step"] - 0.5 for e in mine if e["event"] == kind]
            if at:
                zoom.plot(at, [y] * len(at), marker, color=mcolour, markersize=11, linestyle="none",
                          label=label(zoom, name))
    whole.set_yticks([-r for r in ranks], [f"rank {r}" for r in ranks])
    whole.set_ylim(-len(ranks) + 0.4, 0.6)
    whole.set_xlabel("seconds since the first worker started (training: the dark end of each bar, by step below)")
    if title:
        whole.set_title(title)
    last_step = max(e.get("step", 0) for e in events)
    zoom.set_yticks([-i for i in range(len(rows))], [f"attempt {a}, rank {r}" for a, r in rows])
    zoom.set_ylim(-len(rows) + 0.4, 0.85)
    zoom.set_xticks(range(0, last_step + 1))
    zoom.set_xlim(-0.9, last_step + 0.5)
    zoom.set_xlabel("step number")
    zoom.set_title("the training part of each attempt, by step", fontsize=10)
    for ax in (whole, zoom):
        if labelled[ax]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.05), fontsize=8, frameon=False)
    return fig
