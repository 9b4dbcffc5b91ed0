"""Pictures of what a collective did, drawn from the tensors the ranks really held.

A collective is easiest to understand as a before/after picture: one row per
rank, the rank's tensor before the call on the left and after it on the
right. :func:`plot_ranks` draws that picture from values the ranks returned
(``ddpkit.launch`` hands them back in rank order), so the figure cannot
disagree with what ran. Every number is written in its cell, and one colour
scale is shared by the whole figure: a value that travelled from rank 2 to
rank 0 keeps its colour, so you can follow it with your eye.

:func:`plot_bandwidth` draws a bandwidth sweep from :mod:`ddpkit._bench`:
time per call and bus bandwidth against the tensor size, one curve per world
size, with the single-process copy as the dashed reference.

Both return the :class:`matplotlib.figure.Figure` (a notebook shows it at the
end of the cell); close it with ``plt.close(fig)`` when you draw many.
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


def plot_ranks(
    before: Sequence[Any],
    after: Sequence[Any] | None = None,
    title: str | None = None,
    labels: tuple[str, str] = ("before", "after"),
    cmap: str = "viridis",
):
    """One row per rank: its value ``before`` the collective and ``after`` it.

    ``before[r]``/``after[r]`` is what rank ``r`` held: a tensor (1-D or 2-D),
    a list of equally long tensors (drawn one per row, e.g. ``all_gather``'s
    output; single values side by side, e.g. ``scatter``'s input), a number, ``None`` (drawn as an empty, dashed box: the rank had
    no such buffer) or any other object (written as text, for the
    ``*_object`` collectives). Pass ``after=None`` for a single column.

    >>> import torch
    >>> fig = plot_ranks([torch.tensor([1., 2.]), torch.tensor([3., 4.])],
    ...                  [torch.tensor([4., 6.])] * 2, title="all_reduce(SUM)")
    >>> len(fig.axes), fig.axes[0].get_ylabel(), fig.axes[1].get_title()
    (4, 'rank 0', 'after')
    >>> import matplotlib.pyplot as plt; plt.close(fig)
    """
    import matplotlib.pyplot as plt
    import numpy as np

    columns = [list(before)] if after is None else [list(before), list(after)]
    if after is not None and len(columns[0]) != len(columns[1]):
        raise ValueError(f"before has {len(columns[0])} ranks but after has {len(columns[1])}")
    world_size = len(columns[0])
    if world_size == 0:
        raise ValueError("nothing to draw: before is empty")
    grids = [[_as_grid(v) for v in column] for column in columns]
    numbers = [g for column in grids for g in column if g is not None and g.size]
    low = min((float(np.min(g)) for g in numbers), default=0.0)
    high = max((float(np.max(g)) for g in numbers), default=1.0)
    width = max((g.shape[1] for g in numbers), default=1)
    height = max((g.shape[0] for g in numbers), default=1)
    fig, axes = plt.subplots(
        world_size, len(columns), squeeze=False,
        figsize=(1.0 + 0.55 * width * len(columns) + 0.6, 0.6 + (0.42 * height + 0.3) * world_size),
    )
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
                ax.set_xlim(0, width)
                ax.set_ylim(0, 1)
                text = "-" if value is None else repr(value)
                ax.text(width / 2, 0.5, text, ha="center", va="center", fontsize=8, wrap=True)
                if value is None:
                    for spine in ax.spines.values():
                        spine.set_linestyle("--")
                continue
            ax.imshow(grid, cmap=cmap, vmin=low, vmax=high if high > low else low + 1, aspect="auto",
                      extent=(0, grid.shape[1], grid.shape[0], 0))
            ax.set_xlim(0, width)
            ax.set_ylim(height, 0)  # one cell is the same size in every panel
            for spine in ax.spines.values():
                spine.set_visible(False)
            middle = (low + high) / 2
            for (i, j), x in np.ndenumerate(grid):
                ax.text(j + 0.5, i + 0.5, _fmt(x), ha="center", va="center", fontsize=8,
                        color="black" if x > middle else "white")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_bandwidth(rows: Iterable[Any], reference: Iterable[Any] = ()):
    """Time per call and bus bandwidth against tensor size, one line per (op, world size).

    ``rows`` are :class:`ddpkit.BandwidthRow` (or dicts with the same keys:
    ``op``, ``world_size``, ``nbytes``, ``seconds``, ``busbw``);
    ``reference`` rows (the copy) are drawn dashed.

    >>> from ddpkit import BandwidthRow
    >>> rows = [BandwidthRow("all_reduce", 2, n, n / 1e9) for n in (1024, 4096)]
    >>> fig = plot_bandwidth(rows, [BandwidthRow("copy", 1, n, n / 2e10) for n in (1024, 4096)])
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['time per call (us)', 'bus bandwidth (GB/s)']
    >>> import matplotlib.pyplot as plt; plt.close(fig)
    """
    import matplotlib.pyplot as plt

    def field(row, name):
        return row[name] if isinstance(row, dict) else getattr(row, name)

    fig, (ax_time, ax_bw) = plt.subplots(1, 2, figsize=(11, 4))
    for dashed, group in ((False, list(rows)), (True, list(reference))):
        curves: dict[tuple, list] = {}
        for row in group:
            curves.setdefault((field(row, "op"), field(row, "world_size")), []).append(row)
        for (op, world_size), curve in curves.items():
            curve.sort(key=lambda row: field(row, "nbytes"))
            x = [field(row, "nbytes") for row in curve]
            label = op if op == "copy" else f"{op}, {world_size} ranks"
            style = dict(linestyle="--" if dashed else "-", marker="o", markersize=3, label=label)
            ax_time.plot(x, [field(row, "seconds") * 1e6 for row in curve], **style)
            ax_bw.plot(x, [field(row, "busbw") for row in curve], **style)
    for ax, ylabel in ((ax_time, "time per call (us)"), (ax_bw, "bus bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
