"""Which PyTorch this is (release; CPU, CUDA or ROCm wheel), and when a fork is still safe.

``pip install torch`` gives a Linux learner the CUDA wheel, also on a laptop
with no GPU; the course was recorded with the CPU wheel. Both run every
chapter on the CPU with gloo; a few messages differ, and the chapters say
which build prints which (:func:`torch_build` names the build you have).

**Fork safety.** A process forked after CUDA was touched cannot use CUDA: its
first CUDA call fails with "Cannot re-initialize CUDA in forked subprocess".
PyTorch's own rule (``torch/csrc/utils/device_lazy_init.cpp``,
``register_fork_handler_for_device_init``): PyTorch's bindings register a
``pthread_atfork`` handler before their first call into the CUDA runtime
(``torch._C._cuda_getDeviceCount``, CUDA's lazy initialisation), and every
child forked after it is *in a bad fork*. ``torch.cuda.is_available()`` makes
such a call, and so does ``torch.cuda.device_count()`` where NVML cannot
count the GPUs (no NVIDIA driver), while ``torch.cuda.is_initialized()``
stays ``False`` after both. (CUDA started outside PyTorch, by CuPy, Numba or
a C extension, sets no such flag, and no probe can see it.)
So ddpkit does not guess: :func:`fork_poisoned` forks a tiny child that
reports ``torch.cuda._is_in_bad_fork()`` and exits at once, and
``ddpkit.launch`` forks only when that child says no. :func:`gpu_count`
counts GPUs without registering the handler, so ddpkit's own checks
(``DistEnv.device``, chapter 02's first cell) leave the kernel forkable.

>>> from ddpkit import gpu_count, torch_build
>>> gpu_count() >= 0, torch_build().kind in ("CPU", "CUDA", "ROCm")
(True, True)
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import select
import sys
import warnings


def _cuda_built() -> bool:
    import torch

    return torch.backends.cuda.is_built() or torch.version.hip is not None


def _driver_present() -> bool:
    """Can the NVIDIA driver's library be loaded? (Loading it asks nothing of CUDA.)"""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def gpu_count() -> int:
    """How many CUDA GPUs PyTorch can see here, counted so as to leave later forks safe where it can.

    ``torch.cuda.device_count()`` asks NVML first and the CUDA runtime only
    when NVML cannot answer; asking the runtime makes every later fork a bad
    one. Here NVML answers when it can (``CUDA_VISIBLE_DEVICES`` is honoured),
    and where NVML's library is missing and no NVIDIA driver is installed
    either (a CUDA wheel on a laptop), the answer is 0 with no runtime call.
    Where NVML cannot answer but a driver is there (MIG UUIDs in
    ``CUDA_VISIBLE_DEVICES``, a container without NVML, an NVML error), the
    runtime counts, and on ROCm ``device_count()`` asks amdsmi first and the
    runtime without it; asking the runtime does make later forks unsafe;
    :func:`fork_poisoned` then notices. The count is cached per value of
    ``CUDA_VISIBLE_DEVICES`` (``DistEnv.device`` asks it often).

    >>> gpu_count() >= 0
    True
    """
    import torch

    if not _cuda_built():
        return 0
    if torch.cuda.is_initialized() or torch.version.hip is not None:
        return torch.cuda.device_count()
    return _count_without_runtime(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.lru_cache(maxsize=8)
def _count_without_runtime(visible: str | None) -> int:
    import torch

    nvml = getattr(torch.cuda, "_device_count_nvml", None)  # private; present in 2.11 to 2.15
    count = nvml() if nvml is not None else -1  # -1: NVML could not answer
    if count >= 0:
        return count
    if not sys.platform.startswith("linux") or _driver_present():
        return torch.cuda.device_count()  # asks the runtime: fork_poisoned() is True from here on
    return 0


_POISONED: list[bool] = []  # [True] once a probe said so: a process never becomes forkable again


def fork_poisoned(timeout: float = 5.0) -> bool:
    """Would a child forked from this process now be in a bad fork (unable to use CUDA)?

    Asks PyTorch in a real forked child, which reports
    ``torch.cuda._is_in_bad_fork()`` through a pipe and exits with
    ``os._exit`` (a few tens of milliseconds, on CUDA builds only). On a
    CPU-only build, or where ``fork`` does not exist, the answer is ``False``
    without forking. A probe that cannot fork or gets no answer within
    ``timeout`` seconds counts as poisoned: then ddpkit does not fork.

    >>> fork_poisoned() in (True, False)   # False unless this process touched CUDA on a CUDA build
    True
    """
    import torch

    if not _cuda_built() or not hasattr(os, "fork"):
        return False
    if _POISONED or torch.cuda._is_in_bad_fork():  # known, or this process is itself a bad fork's child
        return True
    answer = _probe(timeout)
    if answer:
        _POISONED.append(True)
    return answer


def _probe(timeout: float) -> bool:
    import torch

    read, write = os.pipe()
    try:
        with warnings.catch_warnings():  # Python 3.12+: "fork() in a multi-threaded process" (the child only reports)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:  # e.g. no memory to fork a large kernel: do not fork ranks either
        os.close(read)
        os.close(write)
        return True
    if pid == 0:  # the child: one byte, then gone (no cleanup, no atexit, no flush)
        try:
            os.write(write, b"1" if torch.cuda._is_in_bad_fork() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], timeout)
        answer = os.read(read, 1) if ready else b""
    finally:
        os.close(read)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored)
            pass
    return answer != b"0"


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """This PyTorch: release, wheel kind, CUDA runtime it was built with, GPUs it can use."""

    version: str  #: ``torch.__version__``, e.g. ``"2.14.1+cu130"``
    kind: str  #: ``"CPU"``, ``"CUDA"`` or ``"ROCm"``: what the wheel was built for
    runtime: str | None  #: ``torch.version.cuda`` (or ``hip``); ``None`` on a CPU wheel
    gpus: int  #: :func:`gpu_count`

    def __str__(self) -> str:
        if self.kind == "CPU":
            return f"torch {self.version}, CPU build"
        seen = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} seen"
        return f"torch {self.version}, {self.kind} build (runtime {self.runtime}), {seen}"


def torch_build() -> TorchBuild:
    """Describe the installed PyTorch without touching CUDA (see :func:`gpu_count`).

    >>> str(torch_build()).startswith("torch 2.")
    True
    """
    import torch

    if torch.version.hip is not None:
        kind, runtime = "ROCm", torch.version.hip
    elif torch.backends.cuda.is_built():
        kind, runtime = "CUDA", torch.version.cuda
    else:
        kind, runtime = "CPU", None
    return TorchBuild(torch.__version__, kind, runtime, gpu_count())
