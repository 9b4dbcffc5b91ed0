"""``ddpkit.launch``: run a notebook function in N real ``torch.distributed`` processes.

What ``torchrun`` does for a script, :func:`launch` does for a function
defined in a notebook cell:

* it starts ``world_size`` processes through :mod:`torch.multiprocessing`
  (fork when that is safe, which takes milliseconds; otherwise a forkserver
  that has PyTorch preloaded, nearly as fast; spawn only when asked);
* it gives each one the environment ``torchrun`` would (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ... see :mod:`ddpkit._env`), so the same
  function later runs unchanged under ``torchrun``;
* it relays every rank's output into the cell, ``[rankN]:``-prefixed: rank 0
  live, the others in rank order when they finish, so a cell's output is the
  same on every run;
* it returns the ranks' return values, or raises :class:`RankFailedError`
  naming the likely root-cause rank, or :class:`LaunchTimeoutError` showing where
  each rank was stuck, and in every case leaves no process, descriptor or
  file behind.

The parent is a single-threaded event loop over the children's pipes and
process sentinels: no helper threads, and Ctrl-C lands where it can stop
everything.
"""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import marshal
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import types
import warnings
from multiprocessing.connection import wait as _wait
from typing import Any, Callable, Mapping, Sequence

import cloudpickle
import psutil

from . import _child
from ._build import fork_poisoned, gpu_count
from ._env import DDPKIT_MARKER, DDPKIT_PG_TIMEOUT, patched_environ, torchrun_environ
from ._errors import LaunchTimeoutError, RankFailedError, RankFailure, classify, describe_exitcode, trim_stack
from ._output import Relay
from ._progress import ProgressBars

_BACKENDS = ("gloo", "nccl", "mpi")
_START_METHODS = ("auto", "fork", "spawn", "forkserver")
FAILURE_WINDOW = 1.0  # seconds to keep collecting failures after the first one, to find the root cause
STOP_GRACE = 0.5  # seconds between SIGTERM and SIGKILL when stopping ranks


# --------------------------------------------------------------------------- checks


def check_count(name: str, value: object) -> None:
    """Refuse anything but a whole number >= 1 (``True`` included) for ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def check_timeout(timeout: object) -> None:
    """Refuse a timeout that is neither a positive number of seconds nor ``None``."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")


def _check_backend(backend: str, local_world_size: int) -> None:
    import torch.distributed as dist

    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a string such as 'gloo', got {backend!r}")
    names = [part.split(":")[-1].strip() for part in backend.split(",")]
    unknown = [n for n in names if n not in _BACKENDS]
    if unknown:
        raise ValueError(
            f"unknown backend {backend!r}. Use 'gloo' (CPU, any machine), 'nccl' (one NVIDIA GPU per "
            "local rank) or a device map such as 'cpu:gloo,cuda:nccl'."
        )
    if "mpi" in names:
        raise ValueError(
            "backend='mpi' needs processes started by mpirun, which ddpkit.launch does not do. "
            "Use backend='gloo' here, or run your script with mpirun."
        )
    if "gloo" in names and not dist.is_gloo_available():
        raise ValueError("this PyTorch build has no gloo backend; install a standard PyTorch build.")
    if "nccl" in names:
        gpus = gpu_count()
        if not dist.is_nccl_available() or gpus < local_world_size:
            raise ValueError(
                f"backend='nccl' needs one GPU per local rank: {local_world_size} local rank(s), but "
                f"this machine has {gpus} GPU(s) visible to PyTorch"
                f"{'' if dist.is_nccl_available() else ' and this PyTorch build has no NCCL'}. "
                "Use backend='gloo' to run on the CPU, or lower world_size."
            )


#: What the forkserver imports once, before it forks any rank: its own clean-up (see
#: ddpkit._forkserver), PyTorch, what DDP imports (torch._dynamo, ~800 modules), and the rank's entry point.
FORKSERVER_PRELOAD = ["ddpkit._forkserver", "torch", "torch.distributed", "torch._dynamo", "cloudpickle", "ddpkit._child"]


def start_method(threads: int = 1) -> tuple[str, str]:
    """Which start method ``launch(start_method="auto")`` picks here and now, and why.

    ``threads`` is the ranks' intra-op thread count (``env={"OMP_NUM_THREADS": ...}``).
    Fork is refused once a forked child could not use CUDA (PyTorch's own
    rule, asked of a real forked child: see :mod:`ddpkit._build`).

    >>> name, why = start_method()
    >>> name in ("fork", "forkserver", "spawn"), isinstance(why, str)
    (True, True)
    """
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if not sys.platform.startswith("linux"):
        if "forkserver" in methods:
            return "forkserver", f"{sys.platform}: fork is not safe here; a forkserver with PyTorch preloaded is"
        return "spawn", f"{sys.platform} has neither a safe fork nor a forkserver"
    if fork_poisoned():
        reason = _POISONED
    elif threads != 1:
        reason = f"the ranks run {threads} threads, and a forked child that starts an OpenMP pool can deadlock"
    else:
        return "fork", "Linux, CUDA untouched in this process, one thread per rank: forking is safe and fastest"
    return "forkserver", reason + "; a forkserver (a fresh process with PyTorch preloaded) is safe and fast"


_POISONED = (
    "a probe child reported a bad fork: CUDA was touched in this process (torch.cuda.is_available(), "
    "device_count() without NVML, or a CUDA tensor), so a forked child could not use CUDA (or the probe "
    "could not run)"
)


def _choose_start_method(start_method_: str, threads: int) -> str:
    if start_method_ not in _START_METHODS:
        raise ValueError(f"start_method={start_method_!r}: use one of {', '.join(_START_METHODS)}")
    if start_method_ == "auto":
        return start_method(threads)[0]
    if start_method_ == "fork" and fork_poisoned():
        raise RuntimeError(
            f"start_method='fork' is unsafe here: {_POISONED} ('Cannot re-initialize CUDA in forked "
            "subprocess'). Pass start_method='auto' (or 'forkserver', 'spawn'), or restart the kernel and "
            "count GPUs with ddpkit.gpu_count(), which leaves forking safe where no driver or NVML answers."
        )
    return start_method_


def _context(method: str):
    """The multiprocessing context for ``method``; a forkserver gets PyTorch preloaded."""
    import torch.multiprocessing as mp

    ctx = mp.get_context(method)
    if method == "forkserver":
        # Only takes effect when the server starts (the first forkserver launch in this process);
        # it then lives, shared by every later launch, until this process exits.
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


class _SourcePickler(cloudpickle.Pickler):
    """cloudpickle, but code objects keep their file names and travel with their cell's source.

    Plain cloudpickle renames a notebook function's file to ``<dynamic-code>``, so a
    spawned rank's traceback would show neither the cell nor the failing line. The
    children run the same interpreter, so ``marshal`` carries code objects whole; the
    notebook's cells live in :mod:`linecache` (IPython registers them there), so we
    ship those entries along and the child puts them back.
    """

    def __init__(self, file):
        super().__init__(file)
        self.sources: dict[str, tuple] = {}

    def reducer_override(self, obj):
        if isinstance(obj, types.CodeType):
            entry = linecache.cache.get(obj.co_filename)
            if entry is not None and not os.path.exists(obj.co_filename):
                self.sources[obj.co_filename] = entry
            return marshal.loads, (marshal.dumps(obj),)
        return super().reducer_override(obj)


def _pickle_payload(fn: Callable, args: Sequence, kwargs: Mapping) -> bytes:
    """Pickle ``(fn, args, kwargs, sources)`` for the ranks, or explain what cannot travel."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    try:
        buffer = io.BytesIO()
        pickler = _SourcePickler(buffer)
        pickler.dump((fn, tuple(args), dict(kwargs)))
        return cloudpickle.dumps((buffer.getvalue(), pickler.sources))
    except Exception as exc:
        raise TypeError(
            f"ddpkit.launch cannot send {getattr(fn, '__name__', fn)!r} or its arguments to the ranks: "
            f"{type(exc).__name__}: {exc}. Functions, lambdas, closures and notebook classes travel fine; "
            "open files, locks, sockets, generators and process groups do not. Create such objects inside "
            "the function instead of capturing them."
        ) from exc


@functools.lru_cache(maxsize=1)
def _loopback_interface() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- stopping


def _stop(procs: list) -> None:
    """Terminate, then kill, every rank still running and everything it started; reap all."""
    alive = [p for p in procs if p.pid is not None and p.exitcode is None]
    descendants: list[psutil.Process] = []
    for p in alive:
        with contextlib.suppress(psutil.Error):
            descendants += psutil.Process(p.pid).children(recursive=True)
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.exitcode is None:
            with contextlib.suppress(OSError):
                p.kill()
            p.join()
    for d in descendants:
        with contextlib.suppress(psutil.Error):
            d.kill()
    psutil.wait_procs(descendants, timeout=2)


# --------------------------------------------------------------------------- launch


def launch(
    fn: Callable[..., Any],
    world_size: int = 4,
    *,
    args: Sequence = (),
    kwargs: Mapping[str, Any] | None = None,
    nnodes: int = 1,
    backend: str = "gloo",
    init_process_group: bool = True,
    start_method: str = "auto",
    timeout: float | None = 60.0,
    env: Mapping[str, str | None] | None = None,
) -> list:
    """Run ``fn(*args, **kwargs)`` in ``world_size`` real processes; return their results in rank order.

    ``fn`` may be anything written in a notebook cell: a function, a lambda,
    a closure, a method of a notebook class. Each process sees the variables
    ``torchrun`` sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ...); ``nnodes``
    pretends the ranks live on that many machines (``LOCAL_RANK = RANK %
    (world_size // nnodes)``); ``env`` adds or overrides variables (``None``
    removes one; ``OMP_NUM_THREADS`` sets the ranks' intra-op threads, 1 by
    default). Caveat: forked ranks inherit the parent's already-imported
    torch, so variables that torch reads only at import time (such as
    ``TORCH_CPP_LOG_LEVEL``, or ``TORCH_DISTRIBUTED_DEBUG``, which a rank can
    read again with ``torch.distributed.set_debug_level_from_env()`` before
    its group exists, as chapter 11 does) must be set before ``import torch``
    in the notebook, or need ``start_method="spawn"``.

    With ``init_process_group=True`` the default process group (``backend``,
    gloo by default) exists when ``fn`` starts and is torn down after it
    returns; with ``False`` the function sets it up itself (for instance with
    :func:`ddpkit.setup_distributed`), and a default group it leaves open is
    torn down the same way, a barrier then ``destroy_process_group()``: destroy
    a group whose collective timed out yourself, since that barrier would fail. Its timeout is ``timeout + 30`` s (5 min
    when ``timeout`` is None), so a hang is reported by the launcher, with
    every rank's stack, rather than by gloo.

    ``start_method="auto"`` forks when that is safe (Linux, CUDA untouched in
    this process, one thread per rank); otherwise it asks a *forkserver* (a
    fresh process, started once per kernel, with PyTorch preloaded) to fork
    the ranks, which is safe and nearly as fast. ``"spawn"`` (a fresh
    interpreter per rank, seconds each) stays available by name.
    :func:`start_method` tells which one ``auto`` picks, and why.

    Raises :class:`RankFailedError` if a rank raises, exits non-zero or is
    killed (the others are stopped), :class:`LaunchTimeoutError` after
    ``timeout`` seconds, and ``ValueError``/``TypeError`` at once for bad
    arguments. Ctrl-C (kernel interrupt) stops every rank.

    >>> import ddpkit, torch, torch.distributed as dist
    >>> def hello():
    ...     t = torch.tensor([dist.get_rank() + 1.0])
    ...     dist.all_reduce(t)
    ...     return t.item()
    >>> ddpkit.launch(hello, world_size=2)
    [3.0, 3.0]
    """
    # --- validate everything before starting anything
    kwargs = {} if kwargs is None else kwargs
    check_count("world_size", world_size)
    check_count("nnodes", nnodes)
    if world_size % nnodes:
        raise ValueError(
            f"world_size={world_size} is not divisible by nnodes={nnodes}: every machine runs the "
            f"same number of processes. Try world_size={nnodes * max(1, round(world_size / nnodes))}."
        )
    check_timeout(timeout)
    extra = {str(k): (None if v is None else str(v)) for k, v in (env or {}).items()}
    threads_text = extra.get("OMP_NUM_THREADS") or "1"
    if not threads_text.isdigit() or int(threads_text) < 1:
        raise ValueError(f"env OMP_NUM_THREADS={threads_text!r} must be a whole number >= 1")
    threads = int(threads_text)
    _check_backend(backend, world_size // nnodes)
    method = _choose_start_method(start_method, threads)
    payload = _pickle_payload(fn, args, kwargs)

    if method == "fork":
        # DistributedDataParallel (and torch.compile) import torch._dynamo, ~800 modules. Imported
        # once here, every forked rank inherits it instead of importing it again (seconds per rank).
        import torch._dynamo  # noqa: F401

    ctx = _context(method)
    pg_timeout = timeout + 30 if timeout is not None else 300.0
    tmpdir = tempfile.mkdtemp(prefix="ddpkit-")
    opts = {
        "backend": backend,
        "init_process_group": bool(init_process_group),
        "store_path": os.path.join(tmpdir, "store"),
        "pg_timeout": pg_timeout,
        "threads": threads,
        "environ": None,  # the rank's whole environment, for a forkserver rank (set below)
    }
    port = _free_port()
    common = {DDPKIT_MARKER: "1", DDPKIT_PG_TIMEOUT: str(pg_timeout)}
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        common["GLOO_SOCKET_IFNAME"] = loopback  # gloo listens on loopback only

    # fork hands the children the objects themselves (code keeps its file names, so tracebacks
    # show the cell's source lines); spawn sends the cloudpickle bytes
    carried = (fn, tuple(args), dict(kwargs)) if method == "fork" else payload
    procs: list = []
    readers: dict = {}  # connection -> (rank, "out" | "err" | "stack" | "result")
    try:
        for rank in range(world_size):
            ends = [ctx.Pipe(duplex=False) for _ in range(4)]  # (reader, writer) for out, err, stack, result
            rank_env = {**torchrun_environ(rank, world_size, nnodes, "127.0.0.1", port, threads), **common, **extra}
            rank_opts = dict(opts)  # pickled when the rank starts (spawn, forkserver), below
            p = ctx.Process(
                target=_child.main,
                args=(rank, world_size, carried, tuple(w for _, w in ends), rank_opts),
                name=f"ddpkit-rank{rank}",
            )
            procs.append(p)
            for (r, _), kind in zip(ends, ("out", "err", "stack", "result")):
                readers[r] = (rank, kind)
            try:
                with patched_environ(rank_env), warnings.catch_warnings():
                    if method == "forkserver":  # its child inherits the *server's* environment: send the rank's
                        rank_opts["environ"] = dict(os.environ)
                    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
                    p.start()
            finally:
                for _, w in ends:
                    w.close()
        try:
            return _supervise(procs, readers, world_size, nnodes, timeout)
        except (RankFailedError, LaunchTimeoutError) as exc:
            raise exc.with_traceback(None)  # the ranks' tracebacks are in the message; skip the launcher's loop
        except KeyboardInterrupt:
            running = [rank for rank, p in enumerate(procs) if p.exitcode is None]
            # one line instead of a traceback through the launcher's event loop; `finally` stops them
            raise KeyboardInterrupt(
                f"ddpkit.launch interrupted: stopped {_ranks_text(running)} of {world_size} (still running)"
                if running else f"ddpkit.launch interrupted after all {world_size} ranks had ended"
            ).with_traceback(None) from None
    finally:
        _stop(procs)
        for conn in readers:
            conn.close()
        for p in procs:
            with contextlib.suppress(ValueError):
                p.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _ranks_text(ranks: list[int]) -> str:
    """``rank 2`` / ``ranks 0, 1, 3``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _supervise(procs: list, readers: dict, world_size: int, nnodes: int, timeout: float | None) -> list:
    per_node = world_size // nnodes
    relay = Relay()
    bars = ProgressBars(world_size)
    stacks = {r: b"" for r in range(world_size)}
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str]] = {}
    failures: dict[int, RankFailure] = {}
    exited: set[int] = set()
    open_readers = dict(readers)
    sentinels = {p.sentinel: rank for rank, p in enumerate(procs)}
    start = last_exit = time.monotonic()
    first_failure: float | None = None

    def read(conn) -> None:
        rank, kind = open_readers[conn]
        try:
            if kind == "result":
                message = cloudpickle.loads(conn.recv_bytes())
                if message[0] == "progress":
                    bars.update(rank, *message[1:])
                elif message[0] == "ok":
                    results[rank] = message[1]
                else:
                    errors[rank] = (message[1], message[2])
                return
            data = os.read(conn.fileno(), 1 << 16)
        except (EOFError, OSError):
            data = b""
        if not data:
            del open_readers[conn]
        elif kind == "stack":
            stacks[rank] += data
        else:
            relay.feed(("rank", rank), kind, data)

    def fail(rank: int, exitcode: int | None, summary: str, tb: str, raised: bool) -> None:
        failures[rank] = RankFailure(
            rank=rank,
            local_rank=rank % per_node,
            node_rank=rank // per_node,
            exitcode=exitcode,
            summary=summary,
            traceback=tb,
            kind=classify(summary, tb, raised),
            order=len(failures),
        )

    try:
        while True:
            now = time.monotonic()
            pending = [s for s, r in sentinels.items() if r not in exited]
            if not pending and not open_readers:
                break
            if first_failure is not None and now - first_failure > FAILURE_WINDOW:
                break
            if not pending and now - last_exit > 2.0:
                break  # ranks are gone; only their leftover children hold the pipes open
            if timeout is not None and now - start > timeout:
                _raise_timeout(procs, exited, readers, open_readers, stacks, timeout)
            ready = _wait(list(open_readers) + pending, timeout=0.05)
            for obj in ready:
                if obj in open_readers:
                    read(obj)
            for obj in ready:
                if obj in sentinels and sentinels[obj] not in exited:
                    rank = sentinels[obj]
                    procs[rank].join()
                    exited.add(rank)
                    last_exit = time.monotonic()
                    # drain what the rank wrote before it died, so its error message is seen
                    for conn, (r, _) in list(open_readers.items()):
                        if r == rank:
                            while conn in open_readers and conn.poll(0):
                                read(conn)
                    code = procs[rank].exitcode
                    if rank in errors:
                        fail(rank, code, *errors[rank], raised=True)
                    elif code != 0 or rank not in results:
                        stack = trim_stack(stacks[rank].decode("utf-8", "replace"))
                        if code is not None and code < 0:
                            summary = f"killed by {describe_exitcode(code)}"
                        elif code == 0:
                            summary = "exited with code 0 before returning a result (os._exit(0)?)"
                        else:
                            summary = f"exited with code {code} without raising a Python exception (os._exit?)"
                        fail(rank, code, summary, stack, raised=False)
                    if rank in failures and first_failure is None:
                        first_failure = time.monotonic()
    finally:
        relay.finish()
        bars.finish(failed=failures, stopped=[r for r in range(world_size) if r not in exited])
    if failures:
        stopped = [r for r in range(world_size) if r not in exited]
        raise RankFailedError(list(failures.values()), stopped, world_size)
    return [results[r] for r in range(world_size)]


def _raise_timeout(procs, exited, readers, open_readers, stacks, timeout) -> None:
    running = [r for r in range(len(procs)) if r not in exited]
    for rank in running:
        stacks[rank] = b""
        with contextlib.suppress(OSError):
            os.kill(procs[rank].pid, signal.SIGUSR1)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        stack_conns = [c for c, (r, k) in open_readers.items() if k == "stack" and r in running]
        ready = _wait(stack_conns, timeout=0.1)
        if not ready and all(stacks[r] for r in running):
            break
        for conn in ready:
            data = b""
            with contextlib.suppress(OSError):
                data = os.read(conn.fileno(), 1 << 16)
            if data:
                stacks[readers[conn][0]] += data
            else:
                del open_readers[conn]
    raise LaunchTimeoutError(timeout, running, {r: trim_stack(stacks[r].decode("utf-8", "replace")) for r in running})
