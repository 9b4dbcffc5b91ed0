"""How fast is a collective? Time, algorithm bandwidth and bus bandwidth.

Timing one ``all_reduce`` gives a number that depends on the size of the
tensor and on the number of ranks, so on its own it compares nothing. The
convention of NVIDIA's ``nccl-tests``, used in every cluster benchmark you
will read, turns it into two bandwidths:

* **algorithm bandwidth** ``algbw = bytes / seconds``, where ``bytes`` is the
  size of the tensor each rank hands to ``all_reduce``, ``broadcast`` or
  ``reduce``; for ``all_gather`` it is the whole gathered output (``n`` times
  each rank's input), for ``reduce_scatter`` each rank's whole input (``n``
  times its output), for ``all_to_all`` each rank's send buffer
  (:func:`size_meaning` says it in words).
  It is what your training loop feels.
* **bus bandwidth** ``busbw = algbw * bus_factor(op, n)``. A ring all-reduce
  makes every rank send (and receive) ``2 (n-1)/n`` times the tensor, so
  ``busbw`` is the speed each link actually ran at. It does not change with
  the number of ranks when the algorithm is optimal, which makes it the number
  to compare with the hardware's link speed, and across world sizes.

Small tensors measure latency (a fixed cost per message), large ones
bandwidth: that is why a sweep over sizes, not one number, describes a link.
:func:`collective_bandwidth` runs such a sweep in real process groups
(through :func:`ddpkit.launch`); :func:`copy_bandwidth` times a plain memory
copy of the same bytes in one process, the reference to compare with (at
the same sizes: a copy whose source and destination fit in the CPU caches
runs several times faster than one that streams through main memory); and
:func:`bandwidth_table` prints either. On a busy machine (load average
above the number of cores) every timing is inflated by waiting for a core;
``statistic="min"`` keeps the fastest repeat, the one least delayed. From a
script or a shell::

    python -m ddpkit._bench --world-sizes 2 4 --max-mb 64 --statistic min

Chapter 03 (``notebooks/03_collectives.ipynb``) teaches this module.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Callable, Iterable, Sequence

#: The collectives :func:`collective_bandwidth` can time.
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")

_ITER_BYTES = 1 << 20  # each timed repeat moves at least this much (small tensors loop several times)
_MAX_ITERS = 20
_WARMUP_LOOPS = 3  # untimed loops before each size is timed
_SETTLE_SECONDS = 0.25  # tiny all_reduces before the first size of a launch


@dataclasses.dataclass(frozen=True)
class BandwidthRow:
    """One measurement: ``op`` on ``nbytes`` with ``world_size`` ranks took ``seconds`` per call.

    ``algbw`` and ``busbw`` are in GB/s (10**9 bytes per second). For the
    copy reference ``op`` is ``"copy"`` and ``world_size`` is 1.

    >>> row = BandwidthRow("all_reduce", 4, 10**9, 2.0)
    >>> row.algbw, row.busbw
    (0.5, 0.75)
    """

    op: str
    world_size: int
    nbytes: int
    seconds: float

    @property
    def algbw(self) -> float:
        return self.nbytes / self.seconds / 1e9

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.op, self.world_size)

    def as_dict(self) -> dict:
        """The row as a plain dict, bandwidths included (for pandas, csv, json)."""
        return {**dataclasses.asdict(self), "algbw": self.algbw, "busbw": self.busbw}


def bus_factor(op: str, world_size: int) -> float:
    """How many times its tensor a rank's busiest link carries, per ``nccl-tests``.

    ``2(n-1)/n`` for all_reduce (reduce-scatter, then all-gather), ``(n-1)/n``
    for all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce and
    a plain copy.

    >>> bus_factor("all_reduce", 4), bus_factor("all_gather", 4), bus_factor("broadcast", 4)
    (1.5, 0.75, 1.0)
    """
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "copy"):
        return 1.0
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)} or 'copy'")


_SIZE_MEANING = {
    "all_reduce": "the tensor each rank reduces",
    "broadcast": "the tensor broadcast",
    "reduce": "the tensor each rank reduces",
    "all_gather": "the gathered output (n x each rank's input)",
    "reduce_scatter": "each rank's input (n x its output)",
    "all_to_all": "each rank's send buffer",
    "copy": "the bytes copied",
}


def size_meaning(op: str) -> str:
    """What ``nbytes`` measures for ``op``, following ``nccl-tests`` (for axis labels and tables).

    For all_reduce, broadcast and reduce it is the tensor every rank hands in;
    for all_gather the whole gathered output, ``n`` times what each rank
    contributes; for reduce_scatter each rank's whole input, ``n`` times what it
    keeps; for all_to_all each rank's send buffer.

    >>> size_meaning("all_gather")
    "the gathered output (n x each rank's input)"
    """
    try:
        return _SIZE_MEANING[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)} or 'copy'") from None


def default_sizes(smallest: int = 1 << 10, largest: int = 64 << 20, step: int = 4) -> list[int]:
    """Sizes in bytes from ``smallest`` to ``largest``, each ``step`` times the last.

    >>> default_sizes(1024, 64 * 1024)
    [1024, 4096, 16384, 65536]
    """
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= step
    return sizes


def _time(
    call: Callable[[], object], nbytes: int, repeats: int, sync: Callable[[], object] = lambda: None,
    statistic: str = "median",
) -> float:
    """Seconds per call: a warm-up, then ``repeats`` timed loops of several calls; their median or min.

    The warm-up runs ``_WARMUP_LOOPS`` untimed loops, exactly like the timed
    ones, at *every* size: in a saved run of chapter 03, a single warm-up call
    left the first size of a fresh launch slower than larger ones (its deeper
    notebook measures both ways).
    Its length is a count, not a time, so every rank calls the collective
    equally often.
    """
    iters = max(1, min(_MAX_ITERS, _ITER_BYTES // max(nbytes, 1)))
    sync()
    for _ in range(_WARMUP_LOOPS * iters):
        call()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        samples.append((time.perf_counter() - start) / iters)
    return min(samples) if statistic == "min" else statistics.median(samples)


def _collective(op: str, nbytes: int, world_size: int):
    """The call that runs ``op`` once on float32 buffers of about ``nbytes``, and the exact bytes."""
    import torch
    import torch.distributed as dist

    n = max(world_size, nbytes // 4 // world_size * world_size)  # elements, a multiple of world_size
    whole = torch.ones(n)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(whole)), 4 * n
    if op == "broadcast":
        return (lambda: dist.broadcast(whole, src=0)), 4 * n
    if op == "reduce":
        return (lambda: dist.reduce(whole, dst=0)), 4 * n
    chunks = list(whole.chunk(world_size))
    part = torch.ones(n // world_size)
    if op == "all_gather":
        return (lambda: dist.all_gather(chunks, part)), 4 * n
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter(part, chunks)), 4 * n
    if op == "all_to_all":
        out = torch.empty(n)
        return (lambda: dist.all_to_all_single(out, whole)), 4 * n
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")


def _settle(seconds: float) -> int:
    """Runs in every rank: tiny all_reduces for about ``seconds``, so the first size timed is not the launch's first.

    Every rank stops at the same call: each reports whether its own clock
    has run out (a MAX over the ranks), and all stop once any has; a time
    each rank read alone would leave the ranks calling different numbers of
    collectives, and hang. Returns the number of calls.
    """
    import torch
    import torch.distributed as dist

    done, start, calls = torch.zeros(1), time.perf_counter(), 0
    while True:
        done.fill_(float(time.perf_counter() - start >= seconds))
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        calls += 1
        if done.item():
            return calls


def _probe(op: str, sizes: Sequence[int], repeats: int, statistic: str = "median") -> list[tuple[int, float]]:
    """Runs in every rank: time ``op`` at each size; the slowest rank's time is the collective's."""
    import torch
    import torch.distributed as dist

    world_size = dist.get_world_size()
    _settle(_SETTLE_SECONDS)
    out = []
    for size in sizes:
        call, nbytes = _collective(op, size, world_size)
        seconds = torch.tensor(_time(call, nbytes, repeats, sync=dist.barrier, statistic=statistic), dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        out.append((nbytes, seconds.item()))
    return out


STATISTICS = ("median", "min")


def _check(sizes: Iterable[int], repeats: int, statistic: str = "median") -> list[int]:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be 'median' (a typical call) or 'min' (the fastest repeat), got {statistic!r}")
    sizes = list(sizes)
    if not sizes or any(not isinstance(s, int) or s < 4 for s in sizes):
        raise ValueError(f"sizes must be whole numbers of bytes >= 4, got {sizes!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    return sizes


def collective_bandwidth(
    op: str = "all_reduce",
    world_sizes: Sequence[int] = (2, 4),
    sizes: Sequence[int] | None = None,
    repeats: int = 5,
    timeout: float = 300.0,
    statistic: str = "median",
) -> list[BandwidthRow]:
    """Time ``op`` on gloo for every world size and tensor size; one :class:`BandwidthRow` each.

    Each world size is one :func:`ddpkit.launch`, which first runs tiny
    all_reduces for a quarter of a second (so the first size timed is not the
    launch's first collective). Every rank then times, after three untimed
    warm-up loops at that size, ``repeats`` loops of calls
    (each after a barrier; several calls per
    loop for small tensors, so the clock's resolution does not matter); a
    row's ``seconds`` is the median loop's time per call on the slowest rank
    (``statistic="min"``: the fastest loop's, the better estimate of what the
    machine can do when other programs compete for the cores, because a
    short loop is more likely to run without being queued behind them).
    From about 1 MiB up, a loop is a single call, so use ``repeats`` of 5 or
    more there.
    ``sizes`` are bytes as :func:`size_meaning` defines them per op (the
    tensor per rank for all_reduce; the whole gathered output for all_gather;
    default 1 KiB .. 64 MiB in steps of 4), rounded down to whole float32
    elements divisible by the world size.

    >>> rows = collective_bandwidth("all_reduce", world_sizes=(2,), sizes=[4096], repeats=1)
    >>> [(r.op, r.world_size, r.nbytes) for r in rows], rows[0].busbw > 0
    ([('all_reduce', 2, 4096)], True)
    """
    from ._launch import launch

    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")
    sizes = _check(default_sizes() if sizes is None else sizes, repeats, statistic)
    rows = []
    for world_size in world_sizes:
        results = launch(_probe, world_size, args=(op, sizes, repeats, statistic), timeout=timeout)
        rows += [BandwidthRow(op, world_size, nbytes, seconds) for nbytes, seconds in results[0]]
    return rows


def _copy_probe(sizes: Sequence[int], repeats: int, statistic: str = "median") -> list[tuple[int, float]]:
    import torch

    out = []
    for size in sizes:
        n = max(1, size // 4)
        src, dst = torch.ones(n), torch.empty(n)
        out.append((4 * n, _time(lambda: dst.copy_(src), 4 * n, repeats, statistic=statistic)))
    return out


def copy_bandwidth(
    sizes: Sequence[int] | None = None, repeats: int = 5, statistic: str = "median"
) -> list[BandwidthRow]:
    """Time ``dst.copy_(src)`` of the same sizes in one process: the reference a collective is measured against.

    It runs in a fresh single process (one :func:`ddpkit.launch` rank, one
    thread, like each rank of :func:`collective_bandwidth`), so the notebook's
    own threads and caches do not flatter or hurt it. ``repeats`` and
    ``statistic`` mean what they mean for :func:`collective_bandwidth`.

    >>> rows = copy_bandwidth(sizes=[1 << 20], repeats=1)
    >>> rows[0].op, rows[0].world_size, rows[0].nbytes, rows[0].busbw > 0
    ('copy', 1, 1048576, True)
    """
    from ._launch import launch

    sizes = _check(default_sizes() if sizes is None else sizes, repeats, statistic)
    results = launch(_copy_probe, 1, args=(sizes, repeats, statistic), init_process_group=False)
    return [BandwidthRow("copy", 1, nbytes, seconds) for nbytes, seconds in results[0]]


def _human(nbytes: int) -> str:
    """Bytes as B / KiB / MiB / GiB; a size rounded down by a few bytes still reads as its unit.

    >>> _human(1024), _human(1048572), _human(4194300), _human(1000)
    ('1 KiB', '1 MiB', '4 MiB', '1000 B')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1023.5 or unit == "GiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.4g} {unit}"
        nbytes /= 1024
    raise AssertionError  # pragma: no cover


def bandwidth_table(rows: Iterable[BandwidthRow]) -> str:
    """A fixed-width text table of rows: op, ranks, size, time, algbw and busbw.

    >>> print(bandwidth_table([BandwidthRow("reduce_scatter", 2, 1 << 20, 1e-3)]))
    op              ranks       size     time us  algbw GB/s  busbw GB/s
    reduce_scatter      2      1 MiB      1000.0       1.049       0.524
    """
    lines = [f"{'op':<14}  {'ranks':>5}  {'size':>9}  {'time us':>10}  {'algbw GB/s':>10}  {'busbw GB/s':>10}"]
    for r in rows:
        lines.append(
            f"{r.op:<14}  {r.world_size:>5}  {_human(r.nbytes):>9}  {r.seconds * 1e6:>10.1f}  "
            f"{r.algbw:>10.3f}  {r.busbw:>10.3f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[BandwidthRow]:
    """Command line: print the sweep of one collective and the copy reference."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ddpkit._bench", description=main.__doc__)
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-mb", type=int, default=64, help="largest tensor, MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--statistic", default="median", choices=STATISTICS,
                        help="median: a typical call; min: the fastest repeat (better on a busy machine)")
    a = parser.parse_args(argv)
    sizes = default_sizes(largest=a.max_mb << 20)
    rows = (collective_bandwidth(a.op, a.world_sizes, sizes, a.repeats, statistic=a.statistic)
            + copy_bandwidth(sizes, a.repeats, statistic=a.statistic))
    print(bandwidth_table(rows))
    return rows


if __name__ == "__main__":  # pragma: no cover
    main()


# --------------------------------------------------------------------------- timing claims on shared machines
#
# A sentence such as "8 microbatches idle far less than 1" is a claim about time, and time measured on a
# busy machine includes waiting for a core. The course's rule: measure again when a claim fails, and when
# the machine stays busy, say so instead of failing; on a quiet machine a failed claim is an error.


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where that is missing).

    A container pinned to 2 CPUs of a 16-core host has 2, though
    ``os.cpu_count()`` says 16. A CPU quota (``docker --cpus``) is visible to
    neither.

    >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_busy(factor: float = 1.5) -> bool:
    """Whether the 1-minute load average exceeds ``factor`` times the cores this process may use.

    The threshold leaves room for the ranks a notebook itself runs (2 ranks on
    2 cores give a load near 2); two extra CPU-bound programs push it past 3.
    The load average counts the whole machine, so on a large host shared by
    pinned containers this errs towards "busy" (see :func:`usable_cores`).

    >>> isinstance(machine_busy(), bool)
    True
    """
    return os.getloadavg()[0] > factor * usable_cores()


def check_timing(measure: Callable[[], object], claims: Callable[[object], list[str]], *, attempts: int = 3):
    """Run ``measure()`` until ``claims(result)`` lists no failed claim; return the result.

    ``claims`` returns the sentences that did not hold (an empty list when all
    did). After ``attempts`` measurements that all failed: on a busy machine
    (:func:`machine_busy`) it prints which claims went unchecked and why, and
    returns the last result; on a quiet machine it raises ``AssertionError``
    with the failed claims, since noise alone should not fail them three times.

    >>> figures = iter([3, 1])
    >>> check_timing(lambda: next(figures), lambda x: [] if x < 2 else [f"{x} is not below 2"])
    1
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for _ in range(attempts):
        result = measure()
        failed = claims(result)
        if not failed:
            return result
    if machine_busy():
        print(f"this machine is busy (load average {os.getloadavg()[0]:.1f} on {usable_cores()} cores): after "
              f"{attempts} measurements these timing claims still did not hold, and are not checked in this run: "
              + "; ".join(failed))
        return result
    raise AssertionError(f"timing claims failed {attempts} times on a quiet machine: " + "; ".join(failed))


# --------------------------------------------------------------------------- were the cores free?
#
# The load average cannot say whether a measurement had the machine to itself: it is an average over the
# last minute, and it counts the measurement's own processes (two ranks on two cores make a load near 2).
# What can: the CPU time the whole machine spent during the measurement, less what our own processes spent.


_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


def _machine_busy_seconds() -> float:
    """Busy CPU-seconds of the CPUs this process may run on (all of the machine's where that cannot be told).

    A container pinned to 2 of a host's 64 CPUs counts only its 2: other programs on the host's other CPUs do not
    compete with ours, and programs on our 2 must not be divided by 64 (see :func:`usable_cores`).
    """
    import psutil

    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if allowed is not None:
        per_cpu = _per_cpu_busy_seconds()  # {CPU number: busy seconds}, from /proc/stat
        if per_cpu and allowed <= per_cpu.keys():
            return sum(per_cpu[cpu] for cpu in allowed)
    times = psutil.cpu_times()  # summed over every CPU of the machine
    return sum(getattr(times, f) for f in _BUSY_FIELDS if hasattr(times, f))


def _per_cpu_busy_seconds() -> dict[int, float]:
    # /proc/stat's "cpuN user nice system idle iowait irq softirq steal ..." lines, in clock ticks, by CPU number
    # (psutil's per-CPU list is by position, which differs from the number when a CPU is offline)
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return {}
    busy = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in (fields + ["0"] * 8)[:8])
            busy[int(name[3:])] = (user + nice + system + irq + softirq + steal) / tick
    return busy


def _our_seconds() -> float:
    times = os.times()  # this process, and the children it has waited for (with their own waited-for children)
    ours = times.user + times.system + times.children_user + times.children_system
    return ours + _live_children_seconds()


def _live_children_seconds() -> float:
    # children still running (a forkserver, a rank not yet reaped): their own time and that of the children they
    # have waited for; a forkserver reaps every rank it forked, so its ranks count as ours once they have ended
    import psutil

    total = 0.0
    for child in psutil.Process().children():
        try:
            t = child.cpu_times()
        except psutil.Error:  # it ended meanwhile: os.times() counts it once it is waited for
            continue
        total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """Where the machine's CPU time went while :func:`cpu_use` ran a measurement (all in CPU-seconds).

    ``ours`` is this process's time plus that of the children it waited for
    (ranks forked by :func:`ddpkit.launch`, ``torchrun`` agents and their
    workers), and of the children still running, such as ddpkit's forkserver
    with the ranks it forked and reaped; ``machine`` is the busy time of the
    ``cores`` CPUs this process may run on (:func:`usable_cores`) together;
    ``others`` is the difference: programs that are not ours.

    >>> use = CpuUse(wall=2.0, ours=1.9, machine=2.3, cores=2)
    >>> round(use.others, 2), round(use.others_share, 2)
    (0.4, 0.1)
    """

    wall: float
    ours: float
    machine: float
    cores: int

    @property
    def others(self) -> float:
        return max(0.0, self.machine - self.ours)

    @property
    def others_share(self) -> float:
        """The fraction of all cores' time that other programs took during the measurement."""
        return self.others / (self.wall * self.cores) if self.wall > 0 else 0.0


def cpu_use(fn: Callable, *args, **kwargs):
    """Run ``fn(*args, **kwargs)``; return its result and the :class:`CpuUse` of the machine meanwhile.

    Use it to say whether a timing had the cores to itself: a large
    ``others_share`` (say above 0.1) means other programs competed for the
    CPUs, and a ranking of configurations measured then may say more about
    them than about the configurations. Linux only (it reads the CPU times of
    the CPUs this process may run on from ``/proc/stat``, or ``psutil``'s).

    >>> import time
    >>> def spin():
    ...     start = time.process_time()
    ...     while time.process_time() - start < 0.2: pass
    ...     return "done"
    >>> result, use = cpu_use(spin)
    >>> result, use.ours >= 0.15, 0.0 <= use.others_share <= 1.0
    ('done', True, True)
    """
    machine, ours, start = _machine_busy_seconds(), _our_seconds(), time.perf_counter()
    result = fn(*args, **kwargs)
    wall = time.perf_counter() - start
    use = CpuUse(wall=wall, ours=_our_seconds() - ours, machine=_machine_busy_seconds() - machine,
                 cores=usable_cores())
    return result, use
