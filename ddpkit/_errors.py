"""How a distributed launch fails, reported so a human can act on it.

When one rank of a job fails, the others usually fail a moment later for a
boring reason: their peer vanished, so gloo says ``Connection closed by peer``.
The useful report names the *first* real failure, not the loudest one. So the
launcher collects every rank's ending for a short window and sorts them:

1. a rank that died without raising (a signal such as SIGSEGV, or ``os._exit``),
2. a rank that raised an error of its own,
3. a rank that only saw a communication error caused by someone else,

earliest first within each class. The root cause is a likely one: the rank
that dies first is sometimes the rank that *detected* a problem another rank
made (gloo aborts the rank that receives more bytes than it expects). And the
markers below are gloo's and the launcher's wording: on NCCL the peers of a
dead rank usually hang until the watchdog's timeout instead, and under
``torchrun`` the agent stops them (SIGTERM). :class:`RankFailedError` prints
the root cause first, with its exit code and traceback, in the spirit of
``torch.distributed.elastic``'s ``ChildFailedError``.
"""

from __future__ import annotations

import dataclasses
import signal

#: Messages that mean "a peer went away", not "this rank did something wrong".
_COMM_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "connectFullMesh",
    "Connection refused",
    "NCCL communicator was aborted",
)

DIED, RAISED, COMM = 0, 1, 2  # root-cause preference, lower is more likely the cause


def describe_exitcode(exitcode: int | None) -> str:
    """``exit code 1`` or, for a negative multiprocessing exit code, the signal's name.

    >>> describe_exitcode(-11)
    'signal SIGSEGV (exit code -11)'
    """
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"signal {name} (exit code {exitcode})"
    return f"exit code {exitcode}"


@dataclasses.dataclass
class RankFailure:
    """How one rank ended badly.

    ``summary`` is one line (``ValueError: bad input``); ``traceback`` the
    Python traceback when the rank raised, or the stack faulthandler dumped
    when it crashed (empty when neither exists).
    """

    rank: int
    local_rank: int
    node_rank: int
    exitcode: int | None
    summary: str
    traceback: str = ""
    kind: int = RAISED
    order: int = 0  # when the launcher observed it

    @property
    def signal_name(self) -> str | None:
        """``"SIGSEGV"`` etc. when the rank was killed by a signal, else ``None``."""
        if self.exitcode is not None and self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return None
        return None

    def headline(self) -> str:
        where = f"rank {self.rank} (local rank {self.local_rank}, node {self.node_rank})"
        return f"{where}: {describe_exitcode(self.exitcode)}: {self.summary}"


def trim_stack(dump: str) -> str:
    r"""Keep the user's frames of a faulthandler dump: drop the launcher's own frames below them.

    >>> print(trim_stack('Current thread 0x1 (most recent call first):\n'
    ...                  '  File "nb.py", line 3 in work\n'
    ...                  '  File "/x/ddpkit/_child.py", line 9 in main\n'
    ...                  '  File "/x/multiprocessing/process.py", line 1 in run\n'
    ...                  '\nExtension modules: torch._C (total: 1)'))
    Current thread 0x1 (most recent call first):
      File "nb.py", line 3 in work
    """
    kept, skipping = [], False
    for line in dump.splitlines():
        if line.startswith("Extension modules:"):
            continue
        if "ddpkit/_child.py" in line.replace("\\", "/") and line.rstrip().endswith(" in main"):
            skipping = True  # everything below this frame is bootstrap
            continue
        if not line.startswith("  File "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept).strip()


def classify(summary: str, traceback: str, raised: bool) -> int:
    """Root-cause class of a failure: DIED, RAISED or COMM."""
    if not raised:
        return DIED
    text = summary + "\n" + traceback
    return COMM if any(m in text for m in _COMM_MARKERS) else RAISED


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip().splitlines())


class RankFailedError(RuntimeError):
    """One or more ranks of a :func:`ddpkit.launch` failed.

    ``failures`` lists every failed rank, root cause first; ``root_cause`` is
    ``failures[0]``; ``stopped`` lists the ranks the launcher stopped because
    of the failure. The message starts with the root cause and its traceback.

    >>> import ddpkit
    >>> def fn():
    ...     import os
    ...     if int(os.environ["RANK"]) == 1:
    ...         raise ValueError("bad input")
    >>> try:
    ...     ddpkit.launch(fn, world_size=2, init_process_group=False)
    ... except ddpkit.RankFailedError as err:
    ...     print(err.root_cause.rank, err.root_cause.summary)
    1 ValueError: bad input
    """

    def __init__(self, failures: list[RankFailure], stopped: list[int], world_size: int):
        self.failures = sorted(failures, key=lambda f: (f.kind, f.order, f.rank))
        self.stopped = sorted(stopped)
        self.world_size = world_size
        super().__init__(self._message())

    @property
    def root_cause(self) -> RankFailure:
        return self.failures[0]

    def _message(self) -> str:
        root = self.root_cause
        lines = [
            f"rank {root.rank} of {self.world_size} failed: {root.summary}",
            "",
            "Root Cause (first observed failure):",
            "  " + root.headline(),
        ]
        if root.traceback:
            lines.append(_indent(root.traceback))
        others = self.failures[1:]
        if others:
            lines += ["", "Other failures (most likely consequences of the root cause):"]
            lines += ["  " + f.headline() for f in others]
        if self.stopped:
            ranks = ", ".join(map(str, self.stopped))
            lines += ["", f"Stopped by ddpkit after the failure: rank(s) {ranks}"]
        return "\n".join(lines)


class LaunchTimeoutError(TimeoutError):
    """A :func:`ddpkit.launch` ran longer than its ``timeout``.

    ``ranks`` lists the ranks still running; ``stacks`` maps each to the
    Python stack it was executing when the time ran out (faulthandler's dump,
    so it works even inside a blocked C call such as a collective).
    """

    def __init__(self, timeout: float, ranks: list[int], stacks: dict[int, str]):
        self.timeout = timeout
        self.ranks = sorted(ranks)
        self.stacks = stacks
        lines = [
            f"the launch did not finish within timeout={timeout:g} s; "
            f"still running: rank(s) {', '.join(map(str, self.ranks))}.",
            "If the work is simply long, pass a larger timeout=. If it is stuck, look for a "
            "collective that some rank never reached (every rank must call it, in the same order).",
        ]
        for rank in self.ranks:
            stack = stacks.get(rank, "").strip()
            lines += ["", f"rank {rank} was here:", _indent(stack) if stack else "    (no stack available)"]
        super().__init__("\n".join(lines))
