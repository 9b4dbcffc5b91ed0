"""What a sharding strategy costs one rank: its memory, stacked, and the bytes it received (chapter 09).

Chapter 09's experiment trains one step with each strategy (DDP, ZeRO-1, ``ZeroRedundancyOptimizer``,
FSDP2 both ways) and keeps, for the rank that holds the most, a row ``(memory, received, counts)``:
``memory`` maps a kind of tensor ("parameters", "gradients", ...) to the bytes held, ``received`` is the
bytes the rank received in the step's collectives, ``counts`` maps a collective's name to how many times
it ran. These two functions only show such rows; they measure nothing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

Row = Sequence[Any]  # (memory: Mapping[str, int], received: float, counts: Mapping[str, int])


def plot_memory(rows: Mapping[str, Row], title: str | None = None):
    """Two panels, one bar per strategy: its memory stacked by kind (kB), and the kB it received.

    Every row's ``memory`` must have the same kinds, in the same order: each kind is one colour, in
    the legend below. The second panel starts at 0, and says "nothing received" when no row received
    anything (one rank). It builds a :class:`matplotlib.figure.Figure` without pyplot, so it is safe
    in an experiment's callback thread; nothing needs closing.

    >>> rows = {"DDP": ({"parameters": 4000, "gradients": 4000}, 3000.0, {"allreduce_": 1}),
    ...         "FSDP2": ({"parameters": 1000, "gradients": 1000}, 4500.0, {"_allgather_base_": 2})}
    >>> fig = plot_memory(rows, title="2 ranks")
    >>> memory, traffic = fig.axes
    >>> [float(round(bar.get_width(), 1)) for bar in memory.patches]      # kB: parameters, then gradients
    [4.0, 1.0, 4.0, 1.0]
    >>> [float(round(bar.get_width(), 1)) for bar in traffic.patches]
    [3.0, 4.5]
    """
    from matplotlib.figure import Figure

    names = list(rows)
    kinds = list(rows[names[0]][0]) if names else []
    if any(list(rows[name][0]) != kinds for name in names):
        raise ValueError("every row's memory must have the same kinds, in the same order")
    fig = Figure(figsize=(10, 1.0 + 0.55 * max(len(names), 1)), layout="constrained")
    memory_ax, traffic_ax = fig.subplots(1, 2, sharey=True)
    left = [0.0] * len(names)
    for i, kind in enumerate(kinds):
        values = [rows[name][0][kind] / 1e3 for name in names]
        memory_ax.barh(names, values, left=left, color=f"C{i}", label=kind)
        left = [a + b for a, b in zip(left, values)]
    memory_ax.set_xlabel("kB (1,000 bytes) held by the busiest rank\n(after the step + kept for backward)")
    if kinds:
        fig.legend(*memory_ax.get_legend_handles_labels(), loc="outside lower center", ncols=5, fontsize=8)
    memory_ax.invert_yaxis()
    received = [rows[name][1] / 1e3 for name in names]
    traffic_ax.barh(names, received, color="C5")
    traffic_ax.set_xlim(left=0)
    if not any(received):
        traffic_ax.set_xlim(0, 1)
        traffic_ax.text(0.5, 0.5, "nothing received", transform=traffic_ax.transAxes, ha="center")
    traffic_ax.set_xlabel("kB that same rank received in the step\n(ring model)")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def memory_table(rows: Mapping[str, Row], columns: Sequence[str] | None = None) -> str:
    """The same rows as text: one column per kind of memory, their sum, the bytes received, the calls.

    ``columns`` names the memory columns (default: the kinds themselves); the collectives are listed
    as ``name xN``, or "none".

    >>> print(memory_table({"DDP": ({"params": 4000, "grads": 4000}, 3000.0, {"allreduce_": 1})}))
    strategy                          params     grads        sum  received  collectives
    DDP                                4,000     4,000      8,000     3,000  allreduce_ x1
    """
    names = list(rows)
    kinds = list(rows[names[0]][0]) if names else []
    columns = list(columns) if columns is not None else kinds
    if len(columns) != len(kinds):
        raise ValueError(f"{len(columns)} column names for {len(kinds)} kinds of memory")
    width = max([30] + [len(name) + 2 for name in names])
    lines = [f"{'strategy':{width}}" + "".join(f"{c:>10}" for c in columns) + f"{'sum':>11}{'received':>10}"
             + "  collectives"]
    for name, (memory, received, counts) in rows.items():
        calls = ", ".join(f"{op} x{k}" for op, k in counts.items()) or "none"
        lines.append(f"{name:{width}}" + "".join(f"{v:>10,}" for v in memory.values())
                     + f"{sum(memory.values()):>11,}{received:>10,.0f}  {calls}")
    return "\n".join(lines)
