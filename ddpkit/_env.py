"""The environment a launcher gives each process, and the one set-up function.

Every process of a distributed job runs the same script. The only thing that
tells one process from another is a handful of environment variables that the
launcher (``torchrun``, ``ddpkit.launch``, a cluster scheduler, or you by hand)
puts there before the script starts:

===================  ==========================================  ==============
variable             meaning                                     classic default
===================  ==========================================  ==============
``RANK``             this process's number in the whole job      ``-1``
``LOCAL_RANK``       its number on this machine: picks the GPU   ``-1``
``WORLD_SIZE``       how many processes in the whole job         ``1``
``LOCAL_WORLD_SIZE`` how many processes on this machine
``GROUP_RANK``       which machine (node) this is (``--node_rank``
                     with static rendezvous; c10d assigns it)
``MASTER_ADDR/PORT`` where the rendezvous store listens (rank 0's
                     with ``env://``; the agent's under stock
                     ``torchrun``; ``launch`` meets via a file)
===================  ==========================================  ==============

The defaults ``-1``/``-1``/``1`` are how a script finds out that *no* launcher
started it: then it is a plain single process. :func:`dist_env` reads all of
this into a :class:`DistEnv`; :func:`setup_distributed` turns it into an
initialised process group with the right backend and device, so that one
training script runs unchanged in a notebook (under :func:`ddpkit.launch`),
under ``torchrun`` on a cluster, and as a plain ``python train.py``.

Chapter 01 (``notebooks/01_env_ranks.ipynb``) teaches this module.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import functools
import gc
import os
import sys
from typing import Iterator, Mapping

#: Variables ``torchrun`` sets for every worker (besides ``TORCHELASTIC_*``).
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
)

#: Set by :func:`ddpkit.launch` in every rank, so :func:`dist_env` can tell who launched it.
DDPKIT_MARKER = "DDPKIT_LAUNCHED"
#: The process-group timeout (seconds) that :func:`ddpkit.launch` hands to its ranks.
DDPKIT_PG_TIMEOUT = "DDPKIT_PG_TIMEOUT"


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} is not an integer. "
            f"Unset it or set it to a number, e.g. `export {name}=0`."
        ) from None


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """What the launcher told this process, with the classic defaults.

    Build one with :func:`dist_env`. Fields mirror the variables: ``rank``
    (``RANK``, -1 when unset), ``local_rank`` (``LOCAL_RANK``, -1),
    ``world_size`` (``WORLD_SIZE``, 1), ``local_world_size``, ``node_rank``
    (``GROUP_RANK``), ``nnodes`` (``GROUP_WORLD_SIZE``), ``master_addr``,
    ``master_port``, ``restart_count`` (``TORCHELASTIC_RESTART_COUNT``) and
    ``launcher``: ``"torchrun"``, ``"ddpkit"``, ``"manual"`` (variables set by
    hand or by another tool) or ``"none"``.

    >>> env = dist_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    >>> env.rank, env.local_rank, env.world_size, env.is_main, env.launcher
    (3, 1, 8, False, 'manual')
    >>> dist_env({}).is_distributed
    False
    """

    rank: int = -1
    local_rank: int = -1
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    restart_count: int = 0
    launcher: str = "none"

    @property
    def is_distributed(self) -> bool:
        """True when a launcher set ``RANK``: this process is one of several."""
        return self.rank >= 0

    @property
    def is_main(self) -> bool:
        """True for the one process that logs and saves: rank 0, or a lone process."""
        return self.rank <= 0

    @property
    def device(self):
        """The device this process should use.

        ``cuda:LOCAL_RANK`` when the machine has a GPU for every local rank,
        otherwise the CPU. (LOCAL_RANK, not RANK, picks the GPU: GPUs are
        numbered per machine.) GPUs are counted with :func:`ddpkit.gpu_count`,
        which leaves a machine without a GPU forkable; only where it counts
        enough GPUs does ``torch.cuda.is_available()`` confirm them.

        >>> dist_env({}).device.type in ("cpu", "cuda")
        True
        """
        import torch

        from ._build import gpu_count

        # NVML may count GPUs this wheel cannot drive (say, a driver too old for it): confirm with
        # the runtime, which a machine with GPUs asks anyway before it uses one.
        if gpu_count() >= max(self.local_world_size, 1) and torch.cuda.is_available():
            return torch.device("cuda", max(self.local_rank, 0))
        return torch.device("cpu")

    @property
    def backend(self) -> str:
        """``"nccl"`` when :attr:`device` is a GPU, else ``"gloo"``."""
        return "nccl" if self.device.type == "cuda" else "gloo"


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read the launcher's variables (from ``os.environ`` unless given) into a :class:`DistEnv`.

    The three classic lines are exactly its first three fields::

        local_rank = int(os.getenv('LOCAL_RANK', -1))
        global_rank = int(os.getenv('RANK', -1))
        world_size = int(os.getenv('WORLD_SIZE', 1))

    >>> env = dist_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4",
    ...                 "TORCHELASTIC_RUN_ID": "none"})
    >>> env.launcher, env.is_main
    ('torchrun', True)
    """
    e = os.environ if environ is None else environ
    rank = _int(e, "RANK", -1)
    world_size = _int(e, "WORLD_SIZE", 1)
    if "TORCHELASTIC_RUN_ID" in e:
        launcher = "torchrun"
    elif DDPKIT_MARKER in e:
        launcher = "ddpkit"
    elif rank >= 0 or "WORLD_SIZE" in e:
        launcher = "manual"
    else:
        launcher = "none"
    port = _int(e, "MASTER_PORT", -1)
    return DistEnv(
        rank=rank,
        local_rank=_int(e, "LOCAL_RANK", -1),
        world_size=world_size,
        local_world_size=_int(e, "LOCAL_WORLD_SIZE", world_size if rank >= 0 else 1),
        node_rank=_int(e, "GROUP_RANK", 0),
        nnodes=_int(e, "GROUP_WORLD_SIZE", 1),
        master_addr=e.get("MASTER_ADDR"),
        master_port=None if port < 0 else port,
        restart_count=_int(e, "TORCHELASTIC_RESTART_COUNT", 0),
        launcher=launcher,
    )


def torchrun_environ(
    rank: int,
    world_size: int,
    nnodes: int = 1,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    threads: int = 1,
) -> dict[str, str]:
    """The variables ``torchrun`` would give global rank ``rank`` (as strings).

    ``world_size`` processes spread evenly over ``nnodes`` machines, filled
    machine by machine, exactly as ``torchrun --nnodes=N --nproc_per_node=P``
    numbers them: ``RANK = node_rank * P + LOCAL_RANK``.

    >>> e = torchrun_environ(rank=5, world_size=8, nnodes=2)
    >>> e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"]
    ('5', '1', '1', '4')
    """
    if world_size < 1 or nnodes < 1 or world_size % nnodes:
        raise ValueError(f"world_size={world_size} must be a positive multiple of nnodes={nnodes}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in 0..{world_size - 1}")
    per_node = world_size // nnodes
    values = {
        "RANK": rank,
        "LOCAL_RANK": rank % per_node,
        "WORLD_SIZE": world_size,
        "LOCAL_WORLD_SIZE": per_node,
        "GROUP_RANK": rank // per_node,
        "GROUP_WORLD_SIZE": nnodes,
        "ROLE_NAME": "default",
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": world_size,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
        "OMP_NUM_THREADS": threads,
    }
    return {k: str(v) for k, v in values.items()}


def rank_table(rows: "list[Mapping[str, object]]") -> str:
    """The ranks' variables as a text table: one line per rank, one right-aligned column per variable.

    ``rows`` are dicts with the same keys (a variable's name -> its value), one
    per rank, as a launched function returns them (chapter 01's ``where_am_i``).
    The columns follow the first row's keys; each is as wide as its longest entry.

    >>> print(rank_table([{"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 2},
    ...                   {"RANK": 1, "LOCAL_RANK": 1, "WORLD_SIZE": 2}]))
    RANK  LOCAL_RANK  WORLD_SIZE
       0           0           2
       1           1           2
    """
    if not rows:
        raise ValueError("nothing to show: rows is empty")
    names = list(rows[0])
    widths = {n: max(len(str(n)), *(len(str(row[n])) for row in rows)) for n in names}
    lines = ["  ".join(f"{n:>{widths[n]}}" for n in names)]
    lines += ["  ".join(f"{row[n]!s:>{widths[n]}}" for n in names) for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def patched_environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, with ``None``, remove) variables in ``os.environ``; restore them on exit.

    >>> with patched_environ({"RANK": "2"}):
    ...     dist_env().rank
    2
    """
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def setup_distributed(backend: str | None = None, timeout: float | None = None) -> DistEnv:
    """Initialise the default process group from the launcher's variables; return the :class:`DistEnv`.

    The classic ``setup_distributed()`` made correct:

    * under ``torchrun`` or :func:`ddpkit.launch` it calls
      ``init_process_group(init_method="env://")`` with ``nccl`` and
      ``torch.cuda.set_device(LOCAL_RANK)`` when there is a GPU for each local
      rank, else ``gloo`` on the CPU (``backend=`` overrides the choice);
    * if the group already exists (``ddpkit.launch`` made it) it changes nothing;
    * as a plain single process (no ``RANK``) it initialises nothing.

    Use ``env.device`` for the model and data, ``env.is_main`` for logging
    and saving. ``timeout`` (seconds) bounds every collective; the default is
    the one ``ddpkit.launch`` chose, else 5 minutes (PyTorch's own is 30).

    >>> env = setup_distributed()   # a plain process: nothing to initialise
    >>> env.is_distributed, env.is_main
    (False, True)
    """
    import torch
    import torch.distributed as dist

    from ._build import gpu_count

    env = dist_env()
    if not env.is_distributed or dist.is_initialized():
        return env
    chosen = backend or env.backend
    if "nccl" in chosen:
        if env.device.type != "cuda":
            raise RuntimeError(
                f"backend={chosen!r} needs one GPU per local rank, but this machine has "
                f"{gpu_count()} for LOCAL_WORLD_SIZE={env.local_world_size}. "
                "Call setup_distributed() without backend= to get gloo on the CPU."
            )
        torch.cuda.set_device(env.device)
    if timeout is None:
        timeout = float(os.environ.get(DDPKIT_PG_TIMEOUT, 300))
    release_groups()  # a group destroyed earlier in this process goes now, before its successor starts
    dist.init_process_group(
        backend=chosen,
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    hold_group()  # a DDP model that outlives destroy_process_group() must not free the group last
    return env


# ----------------------------------------------------------------- teardown

#: Process groups destroyed while something else (a DDP model) still held them, kept referenced
#: until :func:`release_groups` frees them safely (see :func:`hold_group`).
_HELD: list = []


def hold_group() -> None:
    """Make sure a DDP model can never be the last holder of a destroyed process group.

    Why: a rank that calls ``destroy_process_group()`` while a DDP model is
    still alive (the classic ending of a training function) leaves the DDP
    ``Reducer`` holding the last reference to the gloo group. When the
    function returns, Python frees the model with the GIL held; the Reducer
    frees the group; ``~ProcessGroupGloo`` joins its worker threads; and a
    worker that is just then freeing a finished collective needs the GIL to
    drop a Python object, so both wait for each other forever (a native stack
    shows ``~Reducer -> ~ProcessGroupGloo -> std::thread::join`` against
    ``~AsyncWork -> gil_scoped_acquire``; PyTorch issue #56297 is this class
    of bug). ``benchmarks/ddp_exit_stress.py`` counts it (``--without-hold``).

    So this wraps ``torch.distributed.destroy_process_group`` (once; the real
    one does all the work): when the destroyed default group is still
    referenced by another Python object (a DDP model keeps it as
    ``model.process_group``), ddpkit keeps one more reference. Then the
    group's last holder is that Python reference, and a Python
    ``ProcessGroup`` releases the GIL before its C++ destructor runs, so the
    workers can finish. :func:`release_groups` drops it once nothing else
    holds it: when this process initialises its next group through
    :func:`setup_distributed`, or at exit (a group still held by a live model
    then stays until the process ends). A group nobody else holds is freed
    by the destroy itself, as without ddpkit. :func:`setup_distributed` and
    ``ddpkit.launch`` call this for you. Not covered: subgroups from
    ``new_group``, and a script that calls ``init_process_group`` itself.
    ``DDPKIT_HOLD_GROUP=0`` switches it off, to reproduce the hang.

    >>> hold_group(); release_groups()   # no group here: nothing held, nothing to free
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if os.environ.get("DDPKIT_HOLD_GROUP") == "0" or not dist.is_available() or not dist.is_initialized():
        return
    global _WATCHED
    _WATCHED = dist.group.WORLD
    destroy = c10d.destroy_process_group
    if getattr(destroy, "_ddpkit_holds", False):
        return

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        global _WATCHED
        destroy(group)
        if _WATCHED is not None and not c10d.is_initialized():  # the default group is gone
            world, _WATCHED = _WATCHED, None
            # references to it now: `world`, getrefcount's argument, and any other holder's
            if sys.getrefcount(world) > 2 and not any(g is world for g in _HELD):
                _HELD.append(world)  # a DDP model still holds it: never let the model free it last

    destroy_process_group._ddpkit_holds = True
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


_WATCHED = None  # the default group hold_group() saw initialised, until it is destroyed


def release_groups() -> None:
    """Free the groups :func:`hold_group` kept that nothing else holds any more (DDP models in cycles go first)."""
    if _HELD:
        gc.collect()
        # 3 references each: the list's, the loop variable's and getrefcount's argument; more means a live holder
        _HELD[:] = [g for g in _HELD if sys.getrefcount(g) > 3]


atexit.register(release_groups)  # under torchrun: at exit, while the interpreter is still whole


#: What the chapters' saved outputs were recorded with (``python -m ddpkit doctor`` compares too).
RECORDED_WITH = {"python": "3.11", "torch": "2.13.0", "build": "CPU"}


#: How the one-line note of :func:`check_recorded_version` starts; the tests' nbval plugin
#: (``tests/nbval_experiments.py``) drops exactly that line before comparing a cell's output.
VERSION_NOTE = "Note: this chapter's outputs were recorded with PyTorch "


def check_recorded_version(version: str | None = None, kind: str | None = None) -> None:
    """Say so, in one line, when this PyTorch differs from the one the chapters' outputs were recorded with.

    Prints nothing when release and build agree, so a chapter's saved output
    stays the same; on another release or build (CPU or CUDA wheel), the note
    tells the learner why messages may differ from the saved ones. ``version``
    and ``kind`` default to the installed torch (see :func:`ddpkit.torch_build`).

    >>> check_recorded_version("2.13.0+cpu", "CPU")   # as recorded: nothing to say
    >>> check_recorded_version("2.14.1+cu130", "CUDA")
    Note: this chapter's outputs were recorded with PyTorch 2.13.0 (CPU build); you run 2.14.1+cu130 (CUDA build). Messages, defaults and timings may differ from the saved outputs.
    """
    if version is None or kind is None:
        from ._build import torch_build

        build = torch_build()
        version, kind = version or build.version, kind or build.kind
    if version.split("+")[0] != RECORDED_WITH["torch"] or kind != RECORDED_WITH["build"]:
        print(
            f"{VERSION_NOTE}{RECORDED_WITH['torch']} ({RECORDED_WITH['build']} build); you run {version} ({kind} "
            "build). Messages, defaults and timings may differ from the saved outputs."
        )
