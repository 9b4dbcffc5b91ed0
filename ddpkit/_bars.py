"""Horizontal bars of named durations: a measured step beside the model's predictions (chapter 12).

:func:`plot_bars` builds a :class:`matplotlib.figure.Figure` directly, never through pyplot, so an
experiment's callback may draw it on another thread.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["plot_bars"]


def plot_bars(values: Mapping[str, float], *, unit: str = "ms", scale: float = 1e3, title: str = ""):
    """One horizontal bar per ``values`` item, top to bottom, each labelled with ``value * scale`` and ``unit``.

    ``values`` maps a label to a quantity in base units (seconds, with the default ``scale=1e3`` drawn
    in milliseconds). Bars take the colours C0, C1, ... in order. Returns the Figure.

    >>> fig = plot_bars({"computation": 0.040, "measured step": 0.052}, title="one step")
    >>> ax = fig.axes[0]
    >>> [t.get_text() for t in ax.get_yticklabels()], [t.get_text() for t in ax.texts]
    (['computation', 'measured step'], [' 40.0 ms', ' 52.0 ms'])
    >>> ax.get_xlabel()
    'ms'
    """
    from matplotlib.figure import Figure

    labels, sizes = list(values), [v * scale for v in values.values()]
    fig = Figure(figsize=(7, 0.45 * len(labels) + 0.8), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(labels, sizes, color=[f"C{i}" for i in range(len(labels))])
    for y, v in enumerate(sizes):
        ax.text(v, y, f" {v:.1f} {unit}", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, max(sizes, default=1) * 1.25 or 1)
    ax.set_xlabel(unit)
    if title:
        ax.set_title(title, fontsize=9)
    return fig
