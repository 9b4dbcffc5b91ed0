"""Live progress from every rank: ``ddpkit.progress(iterable)``.

``ddpkit.launch`` shows rank 0's printed lines live and holds the other ranks'
lines until the end (so a cell's saved output is the same on every run). For
a long run that means ranks 1..N look silent, as if they hung. Wrap the loop
in :func:`progress` inside the ranks and the notebook shows one live bar per
rank while the run goes on::

    def train():
        for batch in ddpkit.progress(loader, desc="epoch 1"):
            ...

How it travels: each rank sends ``(done, total, desc)`` over its result pipe
to the launcher at most ten times a second (and once at the end); the
launcher, a single-threaded loop, redraws an ipywidgets bar per rank. The bars
are displayed as a widget only (no text form), so the notebook's compared
output does not change with timing, and nothing is printed into the rank's
own output. Outside ``ddpkit.launch`` (under ``torchrun``, in a plain
script) :func:`progress` simply yields the items.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

SEND_EVERY = 0.1  # seconds between two progress messages of one rank
_conn = None  # the result pipe, set by ddpkit._child in a rank started by ddpkit.launch


def progress(iterable: Iterable, total: int | None = None, desc: str = "") -> Iterator:
    """Yield the items of ``iterable``; under ``ddpkit.launch``, the notebook shows this rank's bar.

    ``total`` defaults to ``len(iterable)`` when it has one.

    >>> [x * 2 for x in progress(range(3), desc="plain process: just the items")]
    [0, 2, 4]
    """
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    conn = _conn
    if conn is None:
        yield from iterable
        return
    last = 0.0
    done = 0
    _send(conn, 0, total, desc)
    for item in iterable:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= SEND_EVERY:
            last = now
            _send(conn, done, total, desc)
    _send(conn, done, total, desc)


def _send(conn, done: int, total: int | None, desc: str) -> None:
    try:
        conn.send(("progress", done, total, str(desc)))
    except (OSError, ValueError):  # the launcher is gone; keep training quietly
        pass


class ProgressBars:
    """The launcher's side: one bar per rank, created on the first message.

    Bars go to the running experiment's widget when there is one (see
    :mod:`ddpkit._widgets`), otherwise they are displayed in the cell when
    this process is a Jupyter kernel, otherwise nowhere.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.box = None
        self.bars: list = []
        self.labels: list = []

    def _create(self) -> bool:
        try:
            import ipywidgets as widgets
            from IPython import get_ipython
        except ImportError:
            return False
        from ._output import current_sink

        sink = current_sink()
        shell = get_ipython()
        if sink is None and (shell is None or not hasattr(shell, "kernel")):
            return False
        for rank in range(self.world_size):
            self.bars.append(widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="240px")))
            self.labels.append(widgets.Label(f"rank {rank}: waiting"))
        rows = [widgets.HBox([bar, label]) for bar, label in zip(self.bars, self.labels)]
        self.box = widgets.VBox(rows)
        self.box.add_class("ddpkit-progress")
        if sink is not None:
            sink.show(self.box)
        else:
            from IPython.display import display

            # widget view only, no text/plain: nbval compares nothing here, so timing cannot change a saved output
            display({"application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": self.box.model_id}}, raw=True)
        return True

    def update(self, rank: int, done: int, total: Any, desc: str) -> None:
        if self.box is None and not self._create():
            self.update = lambda *a: None  # no frontend: stop trying
            return
        bar = self.bars[rank]
        bar.max = max(1, total or done or 1)
        bar.value = min(done, bar.max)
        of = f"/{total}" if total else ""
        self.labels[rank].value = f"rank {rank}: {desc + ' ' if desc else ''}{done}{of}"

    def finish(self, failed: Iterable[int] = (), stopped: Iterable[int] = ()) -> None:
        """Colour the bars: green for ranks that finished, red for failed, orange for stopped ones."""
        if self.box is None:
            return
        failed, stopped = set(failed), set(stopped)
        for rank, bar in enumerate(self.bars):
            bar.bar_style = "danger" if rank in failed else "warning" if rank in stopped else "success"
