"""Timelines: when each rank was busy, recorded from real clocks (chapter 07).

A pipeline schedule is easiest to understand as a picture: one row per rank,
a box for every forward and backward pass, and the gaps between them, the
*bubble*, where a rank waits for its neighbour. This module records such
pictures from a real run instead of drawing them from a formula:

* each rank makes a :class:`Timeline` (all ranks at once: it starts with a
  barrier and agrees on a clock origin) and wraps its work in
  ``with timeline.span("F", microbatch):``;
* the function returns ``timeline.spans``, :func:`ddpkit.launch` brings every
  rank's spans back, and :func:`plot_timeline` draws them;
* :func:`idle_fraction` is the share of rank-time that was not inside a span:
  the number that pipeline schedules try to make small;
* :func:`replay_pipeline` replays a recorded step as if messages were free,
  to tell the bubble that the compute implies from the time messages took.

The clock is :func:`time.perf_counter`, which on Linux reads
``CLOCK_MONOTONIC``, one clock for the whole machine. After the barrier,
rank 0 broadcasts its host name and its clock reading; ranks on the same
machine take that reading as their origin, so their spans are on exactly one
time axis. Ranks on other machines cannot share a clock that way and start
from the moment they left the barrier, which on a busy machine can be
milliseconds after rank 0 did.

>>> import ddpkit
>>> def work():
...     timeline = ddpkit.Timeline()
...     with timeline.span("F", 0):
...         sum(range(10_000))
...     return timeline.spans
>>> spans = ddpkit.launch(work, world_size=2)
>>> [[s.kind for s in rank] for rank in spans]
[['F'], ['F']]
>>> 0 <= ddpkit.idle_fraction(spans) < 1
True
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

# the colours of the span kinds the chapters use; any other kind gets the next free one
KIND_COLOURS = {"F": "C0", "B": "C1", "I": "C6", "W": "C2", "compute": "C0", "comm": "C3", "send": "C3", "recv": "C4"}
# what the legend says for the short kinds of pipeline schedules
KIND_NAMES = {"F": "F (forward)", "B": "B (backward)", "I": "I (input gradient)", "W": "W (weight gradient)"}


@dataclass(frozen=True)
class Span:
    """One interval of work on one rank: ``kind`` (``"F"``, ``"B"``, ...), a ``label`` and its seconds."""

    kind: str
    label: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Timeline:
    """Records :class:`Span` s in one rank, on a clock whose origin all ranks share.

    Make it in every rank of the group at the same point (when a process
    group exists it calls ``dist.barrier()`` and then agrees on the origin with
    rank 0, see the module's docstring), then wrap each piece of work in
    :meth:`span`.

    >>> timeline = Timeline()                  # no process group: no barrier
    >>> with timeline.span("B", 3):
    ...     pass
    >>> timeline.spans[0].kind, timeline.spans[0].label, timeline.spans[0].seconds >= 0
    ('B', '3', True)
    """

    def __init__(self) -> None:
        import socket

        import torch.distributed as dist

        self.origin = time.perf_counter()
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            here = [socket.gethostname(), time.perf_counter()]
            rank0 = list(here)
            dist.broadcast_object_list(rank0, src=0)
            self.origin = rank0[1] if rank0[0] == here[0] else here[1]
        self.spans: list[Span] = []

    @contextmanager
    def span(self, kind: str, label: object = "") -> Iterator[None]:
        """Time the ``with`` block as one span of ``kind`` (recorded even if the block raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append(Span(kind, str(label), start - self.origin, time.perf_counter() - self.origin))


def idle_fraction(timelines: Sequence[Sequence[Span]], kinds: Sequence[str] | None = None, *, per_rank: bool = False):
    """The share of rank-time outside spans of ``kinds`` (all kinds by default).

    The run lasts from the earliest span's start to the latest span's end over
    all ranks; each of the ``len(timelines)`` ranks could have worked that long.
    With ``per_rank=True``, a list: each rank's idle share of that same run.

    >>> a, b = [Span("F", "0", 0.0, 1.0)], [Span("F", "0", 1.0, 1.5)]
    >>> idle_fraction([a, b])                 # 1.5 s of work in 2 x 1.5 s of rank-time
    0.5
    >>> idle_fraction([a, b], per_rank=True)
    [0.33333333333333337, 0.6666666666666667]
    """
    spans = [s for rank in timelines for s in rank]
    if not spans:
        raise ValueError("no spans recorded: wrap the work in `with timeline.span(kind, label):`")
    makespan = max(s.end for s in spans) - min(s.start for s in spans)
    busy = [sum(s.seconds for s in rank if kinds is None or s.kind in kinds) for rank in timelines]
    if makespan <= 0:
        return [0.0] * len(timelines) if per_rank else 0.0
    if per_rank:
        return [1.0 - b / makespan for b in busy]
    return 1.0 - sum(busy) / (len(timelines) * makespan)


def replay_pipeline(timelines: Sequence[Sequence[Span]]) -> list[list[Span]]:
    """The recorded pipeline step replayed with free messages: each span starts as soon as its input exists.

    ``timelines[r]`` holds the spans of rank ``r``, which runs stage ``r`` of a
    pipeline: kinds ``"F"`` and ``"B"``, labels naming the microbatch (other
    kinds are ignored). The replay keeps each span's length and each rank's
    order. A forward of microbatch ``i`` on rank ``r > 0`` starts when the
    forward of ``i`` on rank ``r - 1`` has ended, a backward on rank
    ``r < p - 1`` when the backward of ``i`` on rank ``r + 1`` has ended, and
    nothing else delays a span: no message takes time, no work runs between
    spans. So its :func:`idle_fraction` is the bubble that these compute times
    alone imply, and what the recorded step idled beyond it went to messages
    and to the work between spans. A recorded step respects those dependencies
    (its ranks share one clock), so the replay never ends later than it did.

    >>> step = [[Span("F", "0", 0.0, 1.0), Span("B", "0", 5.0, 7.0)],      # rank 0
    ...         [Span("F", "0", 1.5, 2.5), Span("B", "0", 2.5, 4.5)]]      # rank 1: 0.5 s late (a message)
    >>> [(s.kind, s.start, s.end) for rank in replay_pipeline(step) for s in rank]
    [('F', 0.0, 1.0), ('B', 4.0, 6.0), ('F', 1.0, 2.0), ('B', 2.0, 4.0)]
    >>> idle_fraction(replay_pipeline(step)) < idle_fraction(step)
    True
    """
    queues = [[s for s in rank if s.kind in ("F", "B")] for rank in timelines]
    origin = min((s.start for rank in queues for s in rank), default=0)
    p, done = len(queues), {}                           # (rank, kind, label) -> replayed end
    replayed: list[list[Span]] = [[] for _ in queues]
    clock = [origin] * p
    while any(len(replayed[r]) < len(queues[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while len(replayed[r]) < len(queues[r]):
                s = queues[r][len(replayed[r])]
                source = r - 1 if s.kind == "F" else r + 1
                ready = clock[r]
                if 0 <= source < p:
                    if (source, s.kind, s.label) not in done:
                        break                            # its input is not computed yet
                    ready = max(ready, done[source, s.kind, s.label])
                replayed[r].append(Span(s.kind, s.label, ready, ready + s.seconds))
                clock[r] = done[r, s.kind, s.label] = ready + s.seconds
                moved = True
        if not moved:
            waiting = [f"rank {r}: {queues[r][len(replayed[r])].kind}{queues[r][len(replayed[r])].label}"
                       for r in range(p) if len(replayed[r]) < len(queues[r])]
            raise ValueError("no span can start: their inputs are never computed (" + ", ".join(waiting) + ")")
    return replayed


def plot_timeline(
    timelines: Sequence[Sequence[Span]],
    *,
    title: str = "",
    colours: Mapping[str, str] | None = None,
    labels: bool = True,
    row_names: Sequence[str] | None = None,
    width: float = 9.0,
):
    """One row per rank (rank 0 on top), a box per span; returns a :class:`matplotlib.figure.Figure`.

    Boxes are coloured by kind and carry their label when there is room.
    Built without pyplot, so it is safe inside an experiment's callback.

    >>> fig = plot_timeline([[Span("F", "0", 0, 0.01)], [Span("F", "0", 0.01, 0.02), Span("B", "0", 0.02, 0.04)]])
    >>> fig.axes[0].get_xlabel()
    'milliseconds'
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    colours = {**KIND_COLOURS, **(colours or {})}
    kinds = list(dict.fromkeys(s.kind for rank in timelines for s in rank))
    spare = iter(f"C{i}" for i in range(5, 10))
    colour = {k: colours[k] if k in colours else next(spare, "grey") for k in kinds}
    spans = [s for rank in timelines for s in rank]
    origin = min((s.start for s in spans), default=0.0)
    extent = max((s.end for s in spans), default=1.0) - origin
    fig = Figure(figsize=(width, 0.9 + 0.45 * len(timelines)), layout="constrained")
    ax = fig.add_subplot()
    for row, rank in enumerate(timelines):
        for s in rank:
            left, span_ms = (s.start - origin) * 1e3, s.seconds * 1e3
            ax.barh(row, span_ms, left=left, height=0.7, color=colour[s.kind], edgecolor="white", linewidth=0.5)
            if labels and s.label and span_ms > extent * 1e3 / 60:
                ax.text(left + span_ms / 2, row, s.label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(timelines)), row_names or [f"rank {r}" for r in range(len(timelines))])
    ax.set_ylim(len(timelines) - 0.5, -0.5)
    ax.set_xlim(0, extent * 1e3 * 1.01 or 1)
    ax.set_xlabel("milliseconds")
    ax.legend(handles=[Patch(color=colour[k], label=KIND_NAMES.get(k, k)) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig
