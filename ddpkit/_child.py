"""What runs inside each rank started by :func:`ddpkit.launch`.

The parent hands every rank four one-way pipes: stdout, stderr, a "stack"
pipe for faulthandler and a "result" pipe. The rank

1. points file descriptors 1 and 2 at the stdout/stderr pipes (``os.dup2``),
   so output written by C code (gloo, OpenMP, ``printf``) is caught too, not
   only Python's ``print``;
2. arms :mod:`faulthandler` on the stack pipe: a segfault leaves a Python
   stack behind, and the parent can ask for a stack dump (SIGUSR1) when the
   launch times out;
3. uses one intra-op thread unless told otherwise (a forked child that
   inherits a busy OpenMP pool deadlocks otherwise);
4. unpickles the user's function (cloudpickle carries notebook functions,
   lambdas, closures and classes by value), initialises the process group if
   asked, runs the function, and sends back the return value or the error.
"""

from __future__ import annotations

import datetime
import faulthandler
import linecache
import os
import signal
import sys
import traceback

from . import _env


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process if the launching process dies (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # pragma: no cover - exotic libc
        pass


def _name_process(rank: int, world_size: int) -> None:
    """Show up in ``ps``/``top`` as ``ddpkit rank 1/4``, not as a copy of the notebook kernel."""
    title = f"ddpkit rank {rank}/{world_size}"
    try:
        import setproctitle

        setproctitle.setproctitle(title)  # the whole command line, as ps -ef shows it
        return
    except ImportError:  # pragma: no cover - setproctitle is a dependency
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_NAME = 15
            ctypes.CDLL(None).prctl(PR_SET_NAME, title.encode()[:15])  # the short name, as ps -e shows it
        except Exception:  # pragma: no cover
            pass


def _redirect(out_conn, err_conn) -> None:
    os.dup2(out_conn.fileno(), 1)
    os.dup2(err_conn.fileno(), 2)
    out_conn.close()
    err_conn.close()
    # Fresh, line-buffered text streams on the new descriptors: a forked child
    # would otherwise keep the notebook kernel's own sys.stdout object.
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def _flush_c_stdio() -> None:
    """Flush C's stdio buffers (``printf`` into a pipe is block-buffered, and a forked child ends with ``_exit``)."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # pragma: no cover - no libc (Windows)
        pass


def _init_group(rank: int, world_size: int, opts: dict) -> None:
    import torch
    import torch.distributed as dist

    if "nccl" in opts["backend"]:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # A FileStore in the launch's private temp dir: the rendezvous listens on
    # no network port at all (a TCPStore would listen on every interface).
    store = dist.FileStore(opts["store_path"], world_size)
    dist.init_process_group(
        backend=opts["backend"],
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=opts["pg_timeout"]),
    )
    _env.hold_group()  # a DDP model must never free this group last (see ddpkit._env.hold_group)


def _finish_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        # Wait for every peer before tearing down: a rank that destroys its
        # group while a slower peer is still connecting makes that peer fail.
        dist.barrier()
        dist.destroy_process_group()


def _report_error(result_conn, exc: BaseException) -> None:
    parts = traceback.format_exception_only(type(exc), exc)  # a SyntaxError's "Type: message" comes last
    summary = (parts[-1] if isinstance(exc, SyntaxError) else parts[0]).strip().splitlines()[0]
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # skip this module's frame
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        result_conn.send(("error", summary, text))
    except Exception:  # the parent is gone or stopped reading
        pass


def main(rank: int, world_size: int, payload, conns: tuple, opts: dict) -> None:
    """Entry point of one rank (the target of its ``multiprocessing.Process``)."""
    out_conn, err_conn, stack_conn, result_conn = conns
    _name_process(rank, world_size)  # first: setproctitle needs the process's original environment block
    if opts.get("environ") is not None:  # forkserver: the launcher's environment, not the server's
        os.environ.clear()
        os.environ.update(opts["environ"])
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C / kernel interrupt
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher stops a rank with SIGTERM (a forkserver sets its own)
    _redirect(out_conn, err_conn)
    faulthandler.enable(file=stack_conn.fileno(), all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_conn.fileno(), all_threads=True)

    import cloudpickle
    import torch

    from . import _progress

    _progress._conn = result_conn  # ddpkit.progress() reports to the launcher through it
    torch.set_num_threads(opts["threads"])
    code = 0
    try:
        if isinstance(payload, bytes):  # spawn: code and the notebook cells' source lines travel pickled
            pickled, sources = cloudpickle.loads(payload)
            linecache.cache.update(sources)
            payload = cloudpickle.loads(pickled)
        fn, args, kwargs = payload
        if opts["init_process_group"]:
            _init_group(rank, world_size, opts)
        value = fn(*args, **kwargs)
        _finish_group()
        try:
            data = cloudpickle.dumps(("ok", value))
        except Exception as exc:
            raise TypeError(
                f"rank {rank} returned a {type(value).__name__} that cloudpickle cannot carry back "
                f"to the launcher ({exc}). Return plain data: numbers, tensors, dicts, lists."
            ) from exc
        result_conn.send_bytes(data)
    except SystemExit as exc:  # sys.exit() inside fn: 0/None is a normal end, as under torchrun
        if exc.code in (0, None):
            result_conn.send(("ok", None))
        else:
            _report_error(result_conn, exc)
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        _report_error(result_conn, exc)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()
    if code:
        # Exit through multiprocessing, which also ends any workers this rank
        # started (e.g. DataLoader workers) instead of leaving them orphaned.
        sys.exit(code)
