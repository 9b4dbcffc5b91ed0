"""Run the real ``torchrun`` on a script, from a notebook cell.

``ddpkit.launch`` is torchrun's little sibling for notebook functions. To see
the real thing, :func:`torchrun` writes a script's source to a private
temporary directory and runs ``python -m torch.distributed.run`` on it, once
per simulated machine ("node"): ``nodes=2`` starts two agents on this
laptop, exactly as two machines would each run the same command with their
own ``--node_rank``.

Two placeholders keep the commands honest and the output reproducible:
``{port}`` becomes a free loopback port (the same for every node) and
``{node_rank}`` the node's number. The workers' lines come back prefixed
``[rankN]:`` (torchrun's own ``--tee`` with a prefix template), the agents'
own messages ``[agentN]:``; rank 0 live, the rest in order at the end (see
:mod:`ddpkit._output`). The agents run in their own process sessions, so
when the run ends, fails, times out or is interrupted, every agent and
worker is stopped and the directory removed.

Chapter 01 uses it for ``--nnodes=2`` and ``--standalone``.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from ._env import DDPKIT_MARKER, DDPKIT_PG_TIMEOUT, TORCHRUN_VARIABLES
from ._launch import _free_port
from ._output import Relay

_WORKER_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_LOG_FLAGS = ("--tee", "-t", "--redirects", "-r", "--log-dir", "--log_dir")


def _stop_sessions(agents: list[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM every agent's whole process group (agent + workers), then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for a in agents:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(a.pid, sig)
        deadline = time.monotonic() + grace
        for a in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.wait(max(0.0, deadline - time.monotonic()))
        if all(a.poll() is not None for a in agents):
            # the agents are gone; make sure no worker of theirs survives either
            for a in agents:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.pid, signal.SIGKILL)
            return


def torchrun(
    code: str,
    *args: str,
    nodes: int = 1,
    script_args: Sequence[str] = (),
    timeout: float | None = 120.0,
    env: Mapping[str, str | None] | None = None,
) -> int:
    """Run ``torchrun *args train.py *script_args`` on the script ``code``; return the exit status.

    ``nodes`` agents are started (one per simulated machine); in ``args``,
    ``{port}`` is replaced by a free loopback port and ``{node_rank}`` by
    each agent's node number. The script runs in a private temporary
    directory that is deleted afterwards (pass absolute paths in
    ``script_args`` for files that must outlive the run). ``env`` adds or
    removes (``None``) variables for the agents. Raises ``TimeoutError``
    after ``timeout`` seconds, having stopped everything.

    >>> import ddpkit
    >>> code = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"
    >>> ddpkit.torchrun(code, "--standalone", "--nproc_per_node=2")
    [rank0]: rank 0 of 2
    [rank1]: rank 1 of 2
    0
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a whole number >= 1, got {nodes!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if not isinstance(code, str) or not code.strip():
        raise ValueError("code must be the source of a Python script (a non-empty string)")
    if nodes > 1 and not any("{node_rank}" in a or "rdzv" in a for a in args):
        raise ValueError(
            f"nodes={nodes} agents need to know which machine they are: add '--node_rank={{node_rank}}' "
            "(static rendezvous) or '--rdzv-backend=c10d' to the torchrun arguments."
        )
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
        agent_env.update(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ", PYTHONUNBUFFERED="1")
        for k, v in (env or {}).items():
            if v is None:
                agent_env.pop(k, None)
            else:
                agent_env[k] = str(v)
        logging = [] if any(a.split("=")[0] in _LOG_FLAGS for a in args) else ["--tee=3", f"--log-dir={tmpdir}/logs"]
        for node in range(nodes):
            node_args = [a.replace("{port}", port).replace("{node_rank}", str(node)) for a in args]
            cmd = [sys.executable, "-m", "torch.distributed.run", *node_args, *logging, script, *map(str, script_args)]
            agents.append(
                subprocess.Popen(
                    cmd, cwd=tmpdir, env=agent_env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )
            )
        return _relay_until_done(agents, timeout)
    finally:
        _stop_sessions(agents)
        for a in agents:
            for pipe in (a.stdout, a.stderr):
                if pipe:
                    pipe.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _relay_until_done(agents: list[subprocess.Popen], timeout: float | None) -> int:
    relay = Relay()
    partial: dict[tuple[int, str], bytes] = {}
    start = time.monotonic()
    with selectors.DefaultSelector() as sel:
        for node, a in enumerate(agents):
            sel.register(a.stdout, selectors.EVENT_READ, (node, "out"))
            sel.register(a.stderr, selectors.EVENT_READ, (node, "err"))
        try:
            while sel.get_map():
                if timeout is not None and time.monotonic() - start > timeout:
                    raise TimeoutError(
                        f"torchrun did not finish within timeout={timeout:g} s; every agent and worker was "
                        "stopped. Pass a larger timeout= if the script is simply long."
                    )
                for key, _ in sel.select(timeout=0.1):
                    node, stream = key.data
                    data = os.read(key.fileobj.fileno(), 1 << 16)
                    if not data:
                        sel.unregister(key.fileobj)
                        data = b"\n" if partial.get((node, stream)) else b""
                    *lines, partial[(node, stream)] = (partial.get((node, stream), b"") + data).split(b"\n")
                    for raw in lines:
                        text = raw.decode("utf-8", "replace")
                        match = _WORKER_LINE.match(text)
                        if match:
                            relay.line(("rank", int(match.group(1))), stream, match.group(2))
                        else:
                            relay.line(("agent", node), stream, text)
        finally:
            relay.finish()
    codes = [a.wait() for a in agents]
    return next((c for c in codes if c != 0), 0)
