"""Imported once, inside ddpkit's forkserver, to remove the server's socket when it exits.

When fork is unsafe, :func:`ddpkit.launch` asks a *forkserver* to start the
ranks: a fresh Python process, started once per kernel, that imports PyTorch
once (the preload) and then forks a rank in milliseconds whenever asked.
Python 3.11's forkserver listens on a Unix socket file in a ``pymp-*``
directory of the kernel's temp dir, which the kernel is meant to remove when
it exits; a Jupyter kernel ends without running those exit handlers, so the
directory would be left behind. The server ends when its kernel goes away
(its "alive" pipe closes) or when Jupyter sends SIGTERM to the kernel's
process group; this module, preloaded in the server only, makes both a normal
exit and removes the socket and its directory then.
"""

from __future__ import annotations

import atexit
import contextlib
import os


def _listening_socket_files() -> list[str]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.laddr for c in psutil.Process().net_connections(kind="unix")
                if c.laddr and c.status == psutil.CONN_NONE and os.path.basename(c.laddr).startswith("listener-")]
    return []


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
        folder = os.path.dirname(path)
        if os.path.basename(folder).startswith("pymp-"):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty: never anything else the kernel kept there


def _exit_on_sigterm(signum, frame):
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not interrupt the clean-up
    if not __import__("sys").is_finalizing():
        raise SystemExit(128 + signum)  # a normal exit, so the clean-up below runs


if "multiprocessing.forkserver" in __import__("sys").modules:  # in the server, not wherever else it is imported
    import signal

    atexit.register(_remove, _listening_socket_files())
    # Jupyter stops a kernel by signalling its whole process group, the server included: SIGTERM
    # must end the server through SystemExit so that atexit runs. Ranks reset it (ddpkit._child).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
