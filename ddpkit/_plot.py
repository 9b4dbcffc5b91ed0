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
Chapter 03 (``notebooks/03_collectives.ipynb``) uses this module.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


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
