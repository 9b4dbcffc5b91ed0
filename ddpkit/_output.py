"""Many processes, one notebook cell: how ddpkit shows the ranks' output.

Every line a rank writes is shown with its origin, like ``torchrun`` does::

    [rank0]: epoch 1 loss 0.41
    [rank1]: epoch 1 loss 0.43

Printing lines as they arrive would interleave the ranks differently on every
run, and a notebook whose stored output changes on every run cannot be
checked. So ddpkit shows **rank 0 live** (long runs still show progress) and
**holds the other ranks' lines**, replaying them in rank order when the run
ends. Everything a rank wrote still appears, and the cell's output is the
same every time.

A source is a ``(kind, index)`` pair: ``("rank", 3)`` prints as ``[rank3]:``;
``("agent", 0)`` (a torchrun agent, see :func:`ddpkit.torchrun`) as
``[agent0]:``. Ranks are replayed before agents.
"""

from __future__ import annotations

import sys

_ORDER = {"rank": 0, "agent": 1}


class Relay:
    """Prefix each source's lines; show one source live, hold the others for :meth:`finish`.

    >>> relay = Relay()
    >>> relay.feed(("rank", 1), "out", b"from one\\n")
    >>> relay.feed(("rank", 0), "out", b"from zero\\npartial")
    [rank0]: from zero
    >>> relay.finish()
    [rank0]: partial
    [rank1]: from one
    """

    def __init__(self, live: tuple[str, int] = ("rank", 0)):
        self.live = live
        self.partial: dict[tuple, bytes] = {}
        self.held: dict[tuple[str, int], list[tuple[str, str]]] = {}

    def feed(self, source: tuple[str, int], stream: str, data: bytes) -> None:
        """Take raw bytes from ``source``'s ``stream`` (``"out"`` or ``"err"``); complete lines are handled."""
        *lines, rest = (self.partial.pop((source, stream), b"") + data).split(b"\n")
        if rest:
            self.partial[(source, stream)] = rest
        for line in lines:
            self.line(source, stream, line.decode("utf-8", "replace"))

    def line(self, source: tuple[str, int], stream: str, text: str) -> None:
        """Show or hold one line of text (without its newline)."""
        kind, index = source
        text = f"[{kind}{index}]: {text.rstrip(chr(13))}\n"
        if source == self.live:
            self._write(stream, text)
        else:
            self.held.setdefault(source, []).append((stream, text))

    @staticmethod
    def _write(stream: str, text: str) -> None:
        target = sys.stdout if stream == "out" else sys.stderr
        target.write(text)
        target.flush()

    def finish(self) -> None:
        """Show unfinished lines, then every held line, sources in order (ranks by number, then agents)."""
        for (source, stream), rest in list(self.partial.items()):
            self.line(source, stream, rest.decode("utf-8", "replace"))
        self.partial.clear()
        for source in sorted(self.held, key=lambda s: (_ORDER.get(s[0], 2), s[1])):
            for stream, text in self.held[source]:
                self._write(stream, text)
        self.held.clear()
