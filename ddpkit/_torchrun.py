"""Run the real ``torchrun`` on a script, from a notebook cell.

``ddpkit.launch`` is torchrun's little sibling for notebook functions. To see
the real thing, :func:`torchrun` writes a script's source to a private
temporary directory and runs ``python -m torch.distributed.run`` on it, once
per simulated machine ("node"): ``nodes=2`` starts two agents on this
laptop, exactly as two machines would each run the same command with their
own ``--node_rank``. In a notebook, ``%load_ext ddpkit`` adds the same thing
as a cell magic::

    %%torchrun --standalone --nproc_per_node=2
    import os
    print("hello from rank", os.environ["RANK"])

Two placeholders keep the commands honest and the output reproducible:
``{port}`` becomes a free loopback port (the same for every node) and
``{node_rank}`` the node's number. The workers' lines come back prefixed
``[rankN]:`` (torchrun's own ``--tee`` with a prefix template), the agents'
own messages ``[agentN]:``; rank 0 live, the rest in order at the end (see
:mod:`ddpkit._output`). ``agent_log="clean"`` keeps the agents' messages but
blanks what changes from run to run (times, pids, hosts, the agent's own
traceback), so a failure report can be read, and compared, every time.
Both ``"clean"`` and the default ``"show"`` drop one known false alarm:
when agent 0, which hosts the agents' store, leaves the exit barrier
first, another agent's last read of that store fails
(``recvValueWithTimeout failed``, C++ frames, then "Error waiting on exit
barrier" and its traceback). That race is PyTorch's
(pytorch/pytorch#69520); it happens after every local worker has finished,
does not change any exit status, and shows up mostly on a busy machine.

Three things make it safe to use again and again:

* **No leftovers.** The agents run in their own process sessions, and each
  worker in a session of its own; when the run ends, fails, times out or is
  interrupted, every agent and every worker it started is stopped and the
  directory removed.
* **Restarts that work.** With ``--max-restarts`` the agent restarts the
  whole worker group after a failure. In PyTorch 2.13 stock torchrun's c10d
  rendezvous gives the workers a store of their own, apart from the
  rendezvous's store at ``--rdzv-endpoint``: machine 0's agent starts a
  second TCPStore, just for the workers, in its first round (or when it has
  just become machine 0 and has none yet) and reuses that *same* store for
  every later attempt (``dynamic_rendezvous.py``, ``next_rendezvous``). The
  new workers' ``init_process_group`` then finds the dead attempt's gloo
  addresses under the very keys it is about to use, may read one before its
  peer overwrites it, and fails with ``Gloo connectFullMesh failed ...
  Connection refused`` or hangs until the process group's timeout.
  :func:`torchrun` therefore sets
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (pass ``env=`` to override): each
  attempt's rank 0 then hosts a fresh store on a fresh port (the workers see
  ``TORCHELASTIC_USE_AGENT_STORE=False``). On a cluster, export the same
  variable before ``torchrun``. Only the c10d rendezvous (``--standalone``,
  ``--rdzv-backend=c10d``) reads it: static rendezvous (``--node_rank``,
  ``--master_port``) always shares the agent's store, and its restarts keep
  the race (``notebooks/deeper/06_elastic.ipynb``, section 4).
* **Late joiners.** ``join_when="text"`` starts node 0 at once and the other
  nodes only after a worker printed a line containing ``text``: a machine
  joining a running elastic job (``--nnodes=1:2``), on cue.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

import psutil

from ._env import DDPKIT_MARKER, DDPKIT_PG_TIMEOUT, TORCHRUN_VARIABLES
from ._launch import _free_port, check_count, check_timeout
from ._output import Relay

#: Starts every piece torchrun's ``--tee`` relays for a worker (through ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``):
#: an ASCII unit separator, which no worker prints, so the pieces can be told apart (see :class:`_TeeSplitter`).
_SEP = b"\x1f"
_TEE_HEADER = re.compile(rb"\x1f\[rank(\d+)\]: ")
_LOG_FLAGS = ("--tee", "-t", "--redirects", "-r", "--log-dir", "--log_dir")
_AGENT_LOGS = ("show", "clean", "hide")
# torchrun's notice that it set OMP_NUM_THREADS=1 (a logging warning, so on stderr): information,
# not an error, so it is shown as ordinary output instead of on a red background
_AGENT_NOTICE = re.compile(r"^(?:\*{10,}|Setting OMP_NUM_THREADS environment variable .*|)$")
#: Our default for every run: a fresh rendezvous store per attempt (see the module docstring).
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
_CLEAN = [  # what changes from run to run in an agent's message, and what to show instead
    (re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] "), r"\1 "),  # glog prefix: level, time, pid, file:line
    (re.compile(r"(pid:? )\d+|(PID )\d+|(process )\d+", re.I), lambda m: (m[1] or m[2] or m[3]) + "<pid>"),
    (re.compile(r"^(\s*time\s*:\s*)\S+"), r"\1<time>"),
    (re.compile(r"^(\s*host\s*:\s*)\S+"), r"\1<host>"),
    (re.compile(r"(of binary: )\S+"), r"\1<python>"),
    (re.compile(r"((?:localhost|127\.0\.0\.1)[:_])\d+"), r"\1<port>"),
]


_EXIT_RACE_CPP = re.compile(r"TCPStore\.cpp:\d+\] \[c10d\] recvValueWithTimeout failed")
_CPP_FRAME = re.compile(r"^(?:Exception raised from |frame #\d+: )")
_ERROR_LINE = re.compile(r"^[\w.]+(Error|Exception)\b")  # a traceback's last line


def _exit_race(text: str, state: list[bool]) -> bool:
    r"""Whether one agent line belongs to the exit-barrier race of pytorch/pytorch#69520 (module docstring).

    The race is a C++ warning and its frames, then the agent's ``logger.exception`` line "Error waiting on
    exit barrier" (``elastic/agent/server/api.py``, ``_exit_barrier``), its traceback and, last, its error
    line. ``state`` is the node's ``[in_cpp_frames, in_race]``, kept between its lines.

    >>> state = [False, False]
    >>> lines = ["[W1130 14:29:45.99 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=4)",
    ...          "Exception raised from recvBytes at Utils.hpp:787 (most recent call first):",
    ...          "frame #0: c10::Error::Error() + 0x9d (0x7f23 in libc10.so)",
    ...          "E1130 14:29:46.001000 7 api.py:1010] Error waiting on exit barrier. Elapsed: 0.5 seconds",
    ...          "Traceback (most recent call last):", '  File "api.py", line 994, in _exit_barrier',
    ...          "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.",
    ...          "I1130 14:29:46.1 7 api.py:1020] Done"]
    >>> [_exit_race(line, state) for line in lines]
    [True, True, True, True, True, True, True, False]
    """
    if _EXIT_RACE_CPP.search(text):
        state[0] = True                                   # the C++ warning, then its frames
        return True
    if state[0]:
        if _CPP_FRAME.match(text):
            return True
        state[0] = False
    if "Error waiting on exit barrier" in text:
        state[1] = True                                   # the agent's log line, then its traceback
        return True
    if state[1]:
        if _ERROR_LINE.match(text):
            state[1] = False                              # the race's own error line, its last
        return True
    return False


def _clean(text: str, state: list[bool]) -> str | None:
    r"""One agent line with the run-specific details blanked; ``None`` to drop it.

    Dropped: the agent's own traceback (its last line, the error, is kept),
    and the exit-barrier race (:func:`_exit_race`), which ``"show"`` drops too.
    ``state`` is the node's ``[in_traceback, exit_race_state]``, kept between
    its lines.

    >>> state = [False, [False, False]]
    >>> lines = ["E1130 14:29:46.001000 7 api.py:1020] worker group failed (pid: 123)",
    ...          "Traceback (most recent call last):", '  File "api.py", line 994, in run',
    ...          "ValueError: worker one is broken", "I1130 14:29:46.1 7 api.py:1020] Done"]
    >>> [_clean(line, state) for line in lines]
    ['E worker group failed (pid: <pid>)', None, None, 'ValueError: worker one is broken', 'I Done']
    """
    if _exit_race(text, state[1]):
        return None
    if text == "Traceback (most recent call last):":
        state[0] = True
    if state[0]:
        if not _ERROR_LINE.match(text):
            return None
        state[0] = False
    for pattern, replacement in _CLEAN:
        text = pattern.sub(replacement, text)
    return text.rstrip()


class _TeeSplitter:
    r"""Whole lines, each with its owner (a rank, or ``None`` for the agent), from one agent's stdout or stderr.

    torchrun's ``--tee`` relays each worker's log file with a thread per
    worker that reads ``readline()`` pieces and writes ``header + piece`` to
    the agent's stream. A piece is not always a whole line: a worker's
    unbuffered ``print`` writes its text and its ``"\n"`` separately, and a
    ``readline()`` at the end of the file returns what is there so far. Two
    workers' pieces then interleave on the agent's stream ("...sum 6[rank1]:
    ..." on one line). Every header starts with :data:`_SEP`, so a piece runs
    from its header to its ``"\n"`` or to the next header; pieces are joined
    per owner into whole lines. Text outside any piece is the agent's own.

    >>> s = _TeeSplitter()
    >>> s.feed(b"\x1f[rank0]: sum 6\x1f[rank1]: sum 6\x1f[rank0]: \n\x1f[rank1]: \nI agent says hi\n")
    [(0, 'sum 6'), (1, 'sum 6'), (None, 'I agent says hi')]
    >>> s.feed(b"\x1f[ran"), s.feed(b"k2]: half a "), s.feed(b"line\n"), s.finish()
    ([], [], [(2, 'half a line')], [])
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._owner: int | None | bool = False  # False: between pieces; None: the agent; an int: that rank
        self._partial: dict[int | None, bytes] = {}

    def feed(self, data: bytes) -> list[tuple[int | None, str]]:
        """Take the next bytes read from the stream; return the lines they complete, in order."""
        self._buffer += data
        lines = []
        while self._buffer:
            if self._owner is False:  # a new piece: a worker's header, or the agent's own text
                if self._buffer.startswith(_SEP):
                    header = _TEE_HEADER.match(self._buffer)
                    if header is None:
                        if len(self._buffer) < 32 and b"\n" not in self._buffer:
                            break  # the header is still arriving
                        self._owner, self._buffer = None, self._buffer[1:]  # not ours after all: the agent's text
                        continue
                    self._owner, self._buffer = int(header.group(1)), self._buffer[header.end():]
                else:
                    self._owner = None
            ends = [i for i in (self._buffer.find(b"\n"), self._buffer.find(_SEP)) if i >= 0]
            end = min(ends) if ends else len(self._buffer)
            piece, newline = self._buffer[:end], self._buffer[end:end + 1] == b"\n"
            self._buffer = self._buffer[end + newline:]
            self._partial[self._owner] = self._partial.get(self._owner, b"") + piece
            if newline:
                lines.append((self._owner, self._partial.pop(self._owner).decode("utf-8", "replace")))
            if newline or ends:
                self._owner = False
        return lines

    def finish(self) -> list[tuple[int | None, str]]:
        """The stream ended: every owner's unfinished line, as a line."""
        lines = self.feed(b"")
        if self._buffer:  # an unfinished header
            self._partial[None] = self._partial.get(None, b"") + self._buffer
            self._buffer = b""
        self._owner = False
        return lines + [(owner, rest.decode("utf-8", "replace")) for owner, rest in self._partial.items() if rest]


def _stop_sessions(agents: list[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM every agent's session, then SIGKILL what is left, including workers in sessions of their own."""
    family: list[psutil.Process] = []
    for a in agents:
        with contextlib.suppress(psutil.Error):
            family += psutil.Process(a.pid).children(recursive=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for a in agents:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(a.pid, sig)
        deadline = time.monotonic() + grace
        for a in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.wait(max(0.0, deadline - time.monotonic()))
        if all(a.poll() is not None for a in agents):
            break
    # the agents are gone; no worker (each has its own session) or worker's child may survive them
    for p in family:
        with contextlib.suppress(psutil.Error):
            if p.is_running():  # is_running also guards against a reused pid
                p.kill()
    psutil.wait_procs(family, timeout=grace)


def torchrun(
    code: str | os.PathLike,
    *args: str,
    nodes: int = 1,
    script_args: Sequence[str] = (),
    timeout: float | None = 120.0,
    env: Mapping[str, str | None] | None = None,
    agent_log: str | list = "show",
    join_when: str | None = None,
) -> int:
    """Run ``torchrun *args train.py *script_args`` on the script ``code``; return the exit status.

    ``code`` is the script's source, or a path to a script file. ``nodes``
    agents are started (one per simulated machine); in ``args``, ``{port}``
    is replaced by a free loopback port and ``{node_rank}`` by each agent's
    node number. With ``join_when``, nodes 1, 2, ... start only once a
    worker printed a line containing that text. The script runs in a
    private temporary directory that is deleted afterwards (pass absolute
    paths in ``script_args`` for files that must outlive the run). ``env``
    adds or removes (``None``) variables for the agents, on top of
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (reliable restarts).
    ``agent_log``: ``"show"`` the agents' lines as they are (less the exit-barrier
    false alarm of the module docstring), ``"clean"``
    them of times, pids, hosts and ports, ``"hide"`` them, or pass a list
    to collect them (raw) instead of printing. Raises ``TimeoutError``
    after ``timeout`` seconds, having stopped everything.

    >>> import ddpkit
    >>> code = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"
    >>> ddpkit.torchrun(code, "--standalone", "--nproc_per_node=2", agent_log="hide")
    [rank0]: rank 0 of 2
    [rank1]: rank 1 of 2
    0
    """
    check_count("nodes", nodes)
    check_timeout(timeout)
    if isinstance(code, os.PathLike):
        with open(code, encoding="utf-8") as f:
            code = f.read()
    if not isinstance(code, str) or not code.strip():
        raise ValueError("code must be the source of a Python script (a non-empty string) or a path to one")
    if nodes > 1 and not any("{node_rank}" in a or "rdzv" in a for a in args):
        raise ValueError(
            f"nodes={nodes} agents need to know which machine they are: add '--node_rank={{node_rank}}' "
            "(static rendezvous) or '--rdzv-backend=c10d' to the torchrun arguments."
        )
    if not isinstance(agent_log, list) and agent_log not in _AGENT_LOGS:
        raise ValueError(f"agent_log must be one of {_AGENT_LOGS} or a list to collect the lines, got {agent_log!r}")
    if join_when is not None and nodes < 2:
        raise ValueError("join_when delays nodes 1, 2, ...: it needs nodes >= 2")
    tmpdir = tempfile.mkdtemp(prefix="ddpkit-torchrun-")
    agents: list[subprocess.Popen] = []
    try:
        script = os.path.join(tmpdir, "train.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        port = str(_free_port())
        agent_env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
        for k in (DDPKIT_MARKER, DDPKIT_PG_TIMEOUT):
            agent_env.pop(k, None)
        agent_env.update(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="\x1f[rank${rank}]: ", PYTHONUNBUFFERED="1")
        agent_env.update(RESTART_SAFE_ENV)
        for k, v in (env or {}).items():
            if v is None:
                agent_env.pop(k, None)
            else:
                agent_env[k] = str(v)
        logging = [] if any(a.split("=")[0] in _LOG_FLAGS for a in args) else ["--tee=3", f"--log-dir={tmpdir}/logs"]

        def start(node: int) -> subprocess.Popen:
            node_args = [a.replace("{port}", port).replace("{node_rank}", str(node)) for a in args]
            cmd = [sys.executable, "-m", "torch.distributed.run", *node_args, *logging, script, *map(str, script_args)]
            agents.append(
                subprocess.Popen(
                    cmd, cwd=tmpdir, env=agent_env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )
            )
            return agents[-1]

        for node in range(1 if join_when is not None else nodes):
            start(node)
        later = list(range(1, nodes)) if join_when is not None else []
        return _relay_until_done(agents, start, later, join_when, timeout, agent_log, tmpdir)
    finally:
        _stop_sessions(agents)
        for a in agents:
            for pipe in (a.stdout, a.stderr):
                if pipe:
                    pipe.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _relay_until_done(agents, start, later, join_when, timeout, agent_log, tmpdir) -> int:
    relay = Relay()
    splitters: dict[tuple[int, str], _TeeSplitter] = {}
    clean_state: dict[int, list] = {}  # per node: _clean's [in_traceback, _exit_race's state]
    begin = time.monotonic()
    with selectors.DefaultSelector() as sel:

        def watch(node: int, a: subprocess.Popen) -> None:
            sel.register(a.stdout, selectors.EVENT_READ, (node, "out"))
            sel.register(a.stderr, selectors.EVENT_READ, (node, "err"))

        def show(node: int, stream: str, rank: int | None, text: str) -> None:
            nonlocal later
            text = text.replace(tmpdir + os.sep, "")
            if rank is not None:
                relay.line(("rank", rank), stream, text)
                if later and join_when in text:
                    for n in later:
                        watch(n, start(n))
                    later = []
            elif isinstance(agent_log, list):
                agent_log.append(text)
            else:
                notice = stream == "err" and _AGENT_NOTICE.match(text.strip())
                state = clean_state.setdefault(node, [False, [False, False]])
                shown = None  # agent_log="hide"
                if agent_log == "show":
                    shown = None if _exit_race(text, state[1]) else text
                elif agent_log == "clean":
                    shown = _clean(text, state)
                if shown is not None:
                    relay.line(("agent", node), "out" if notice else stream, shown)

        for node, a in enumerate(agents):
            watch(node, a)
        try:
            while sel.get_map():
                if timeout is not None and time.monotonic() - begin > timeout:
                    raise TimeoutError(
                        f"torchrun did not finish within timeout={timeout:g} s; every agent and worker was "
                        "stopped. Pass a larger timeout= if the script is simply long."
                    )
                for key, _ in sel.select(timeout=0.1):
                    node, stream = key.data
                    splitter = splitters.setdefault((node, stream), _TeeSplitter())
                    data = os.read(key.fileobj.fileno(), 1 << 16)
                    if data:
                        lines = splitter.feed(data)
                    else:
                        sel.unregister(key.fileobj)
                        lines = splitter.finish()
                    for rank, text in lines:
                        show(node, stream, rank, text)
        finally:
            relay.finish()
    if later:
        raise RuntimeError(f"the run ended before any worker printed {join_when!r}, so nodes {later} never started")
    codes = [a.wait() for a in agents]
    return next((c for c in codes if c != 0), 0)


# --------------------------------------------------------------------------- the %%torchrun cell magic

_MAGIC_OPTIONS = {"--nodes": int, "--timeout": float, "--agent-log": str, "--join-when": str}


def _parse_magic_line(line: str) -> tuple[list[str], dict, list[str]]:
    """Split a ``%%torchrun`` line into torchrun's arguments, ddpkit's options and the script's arguments.

    >>> _parse_magic_line("--standalone --nproc_per_node=2 --agent-log=hide --timeout 30 -- data.txt")
    (['--standalone', '--nproc_per_node=2'], {'agent_log': 'hide', 'timeout': 30.0}, ['data.txt'])
    """
    words = shlex.split(line)
    script_args: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, script_args = words[:at], words[at + 1:]
    args, options = [], {}
    while words:
        word = words.pop(0)
        name, eq, value = word.partition("=")
        if name in _MAGIC_OPTIONS:
            if not eq:
                if not words:
                    raise ValueError(f"%%torchrun option {name} needs a value")
                value = words.pop(0)
            options[name[2:].replace("-", "_")] = _MAGIC_OPTIONS[name](value)
        else:
            args.append(word)
    return args, options, script_args


def _torchrun_magic(line: str, cell: str) -> int:
    """%%torchrun [--nodes N] [--timeout S] [--agent-log show|clean|hide] [--join-when TEXT] TORCHRUN_ARGS [-- SCRIPT_ARGS]

    Run the cell as a script under the real torchrun (see ``ddpkit.torchrun``);
    the cell's value is the exit status. A line ending in ``\\`` continues
    on the next line of the cell, as in a shell. ``{port}`` and ``{node_rank}`` in
    the line are ddpkit's placeholders (no ``$var`` or ``{var}`` expansion).
    """
    line, cell = _join_continued_lines(line, cell)
    args, options, script_args = _parse_magic_line(line)
    return torchrun(cell, *args, script_args=script_args, **options)


def _join_continued_lines(line: str, cell: str) -> tuple[str, str]:
    r"""A magic line ending in ``\`` continues on the cell's next line (a long command stays readable).

    >>> _join_continued_lines("--standalone \\", "  --nproc_per_node=2\nprint('hi')\n")
    ('--standalone --nproc_per_node=2', "print('hi')\n")
    """
    body = cell.split("\n") if cell else []
    while line.rstrip().endswith("\\") and body:
        line = line.rstrip()[:-1].rstrip() + " " + body.pop(0).strip()
    if line.rstrip().endswith("\\"):
        raise ValueError("the %%torchrun line ends in '\\' but the cell has no next line to continue on")
    return line, "\n".join(body)


_torchrun_magic._ipython_magic_no_var_expand = True  # what IPython's @no_var_expand sets: {port} stays {port}


def register_magics(ipython=None) -> bool:
    """Add the ``%%torchrun`` cell magic to IPython; return whether there was an IPython to add it to.

    ``%load_ext ddpkit`` does the same. Outside IPython it does nothing:

    >>> import ddpkit
    >>> ddpkit.register_magics()
    False
    """
    if ipython is None:
        with contextlib.suppress(ImportError):
            from IPython import get_ipython

            ipython = get_ipython()
    if ipython is None:
        return False
    ipython.register_magic_function(_torchrun_magic, magic_kind="cell", magic_name="torchrun")
    return True


def load_ipython_extension(ipython) -> None:
    """``%load_ext ddpkit``: register the ``%%torchrun`` cell magic."""
    register_magics(ipython)
