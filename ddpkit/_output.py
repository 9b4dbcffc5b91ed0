"""Many processes, one notebook cell: how ddpkit shows the ranks' output.

Every line a rank writes is shown with its origin, like ``torchrun`` does::

    [rank0]: epoch 1 loss 0.41
    [rank1]: epoch 1 loss 0.43

A line that already starts with its own origin is not prefixed twice: PyTorch's C++
warnings name their rank themselves (``[rank0]:[W1130 ...] Warning: ...``). Their
log prefix's clock time (``[W1130 12:34:56.789012345 socket.cpp:469]``) is
dropped, keeping the severity letter and the source file: a time of day tells a
learner nothing about the failure, and it would make every such output differ
from run to run (``[rank0]:[W socket.cpp:469] ...``).

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

import re
import sys

_ORDER = {"rank": 0, "agent": 1}
# the clock of a C++ log prefix, "[W1130 12:34:56.789012345 file.cpp:12]" (glog adds a thread id): not shown
_CLOCK = re.compile(r"^((?:\[\w+\]:)?\[[FEWI])\d{4} \d\d:\d\d:\d\d\.\d+(?: \d+)? ")


class Relay:
    """Prefix each source's lines; show one source live, hold the others for :meth:`finish`.

    >>> relay = Relay()
    >>> relay.feed(("rank", 1), "out", b"from one\\n")
    >>> relay.feed(("rank", 0), "out", b"from zero\\npartial")
    [rank0]: from zero
    >>> relay.finish()
    [rank0]: partial
    [rank1]: from one
    >>> relay.line(("rank", 0), "out", "[rank0]:[W1130 reducer.cpp] Warning: from C++, prefixed already")
    [rank0]:[W1130 reducer.cpp] Warning: from C++, prefixed already
    >>> relay.line(("rank", 0), "out", "[rank0]:[E1202 00:55:13.554803747 ProcessGroupGloo.cpp:67] late")
    [rank0]:[E ProcessGroupGloo.cpp:67] late
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
        prefix, text = f"[{kind}{index}]:", _CLOCK.sub(r"\1 ", text.rstrip(chr(13)))
        # PyTorch's C++ log lines already name their rank ("[rank0]:[W1130 ...] Warning: ..."): not twice
        text = f"{text}\n" if text.startswith(prefix) else f"{prefix} {text}\n"
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


# --------------------------------------------------------------------------- sinks (experiments)
#
# A widget callback (an experiment's Run button) may run on another thread than
# the cell (ipykernel 7 runs JupyterLab's widget messages on a subshell thread).
# Output printed there must land in the experiment's own Output widget, not in
# whatever cell the kernel last ran. A *sink* is where one thread's output goes:
# ``routed_output(sink)`` sends this thread's sys.stdout/stderr writes, and the
# launcher's progress bars, to ``sink`` while other threads keep their streams.

import contextlib
import threading

_local = threading.local()
_route_lock = threading.Lock()


def current_sink():
    """The sink this thread's output goes to, or None (then output goes to the cell)."""
    return getattr(_local, "sink", None)


class _Routed:
    """A stand-in for sys.stdout/stderr that sends one thread's writes to its sink."""

    def __init__(self, original, name: str):
        self.original = original
        self.name = name

    def write(self, text: str) -> int:
        sink = current_sink()
        if sink is None:
            return self.original.write(text)
        sink.write(self.name, text)
        return len(text)

    def flush(self) -> None:
        if current_sink() is None:
            self.original.flush()

    def __getattr__(self, attr):
        return getattr(self.original, attr)


@contextlib.contextmanager
def routed_output(sink):
    """Send this thread's stdout/stderr writes (and launch progress bars) to ``sink`` for the block.

    ``sink`` has ``write(stream, text)`` (stream is ``"stdout"`` or ``"stderr"``)
    and ``show(widget)``.

    >>> class Collect:
    ...     def __init__(self): self.parts = []
    ...     def write(self, stream, text): self.parts.append((stream, text))
    ...     def show(self, widget): pass
    >>> sink = Collect()
    >>> with routed_output(sink):
    ...     print("caught")
    >>> sink.parts
    [('stdout', 'caught'), ('stdout', '\\n')]
    """
    import sys

    with _route_lock:
        for name in ("stdout", "stderr"):
            if not isinstance(getattr(sys, name), _Routed):
                setattr(sys, name, _Routed(getattr(sys, name), name))
    previous = current_sink()
    _local.sink = sink
    try:
        yield sink
    finally:
        _local.sink = previous
