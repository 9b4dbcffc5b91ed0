"""How long does it take to start a distributed job? ddpkit.launch vs mp.spawn vs torchrun.

The job is a "hello world" of world size N: initialise a gloo group, one
all_reduce, return. We time it six ways and print medians and ratios:

* ``ddpkit.launch (warm)``: in an already running Python (like a notebook
  kernel that has imported torch), the time of one ``ddpkit.launch`` call,
  once per start method: ``fork`` (what ``auto`` picks when forking is safe),
  ``forkserver`` (what ``auto`` picks when it is not: CUDA initialised, more
  than one thread per rank, macOS; PyTorch is preloaded in the server, whose
  one-time start is reported separately) and ``spawn`` (a fresh interpreter
  per rank);
* ``ddpkit.launch (process, fork)``: a fresh ``python`` that imports ddpkit and launches;
* ``mp.spawn (process)``: a fresh ``python`` using ``torch.multiprocessing.spawn``;
* ``torchrun (process)``: ``python -m torch.distributed.run --standalone``.

Run by hand:   python benchmarks/launch_latency.py [--world-size 4] [--repeats 5]
Smoke mode:    python benchmarks/launch_latency.py --smoke   (world size 2, one repeat; used by the tests)
All figures:   python benchmarks/run_all.py   (this measurement is one of its parts: ``measure`` below)

These are timings on a shared machine: read them as orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HELLO = """
import os, torch, torch.distributed as dist
def hello(rank=None, world_size=None):
    if rank is not None:  # mp.spawn passes the rank; we set the variables torchrun would
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", init_method="env://")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()
"""

SPAWN_MAIN = HELLO + """
import socket, torch.multiprocessing as mp
if __name__ == "__main__":
    n = int(os.environ["BENCH_WORLD_SIZE"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(hello, args=(n,), nprocs=n)
"""

TORCHRUN_MAIN = HELLO + "\nhello()\n"

DDPKIT_MAIN = """
import os, torch, torch.distributed as dist, ddpkit
def hello():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()
if __name__ == "__main__":
    n = int(os.environ["BENCH_WORLD_SIZE"])
    assert ddpkit.launch(hello, world_size=n) == [float(n)] * n
"""


def time_process(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"{cmd} failed with exit status {done.returncode}:\n{done.stderr}")
    return time.perf_counter() - start


def _hello():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def time_warm_ddpkit(world_size: int, repeats: int, method: str = "fork") -> tuple[list[float], float]:
    """Warm launch times with ``method``, and the first (warm-up) launch's time (a forkserver starts then)."""
    import ddpkit

    start = time.perf_counter()
    ddpkit.launch(_hello, world_size=world_size, start_method=method)  # warm-up
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert ddpkit.launch(_hello, world_size=world_size, start_method=method) == [float(world_size)] * world_size
        times.append(time.perf_counter() - start)
    return times, first


#: The rows of the result, in the order they are measured and printed.
LABELS = (
    "ddpkit.launch (warm, fork)",
    "ddpkit.launch (warm, forkserver)",
    "ddpkit.launch (warm, spawn)",
    "ddpkit.launch (process, fork)",
    "mp.spawn (process)",
    "torchrun (process)",
)


def measure(world_size: int, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of each way to start a job (``LABELS``), and each start method's first (warm-up) launch.

    Used by this script and by ``benchmarks/run_all.py``.
    """
    n = world_size
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        # TMPDIR too: torchrun leaves a torchelastic_* log directory behind in it
        env = {**os.environ, "BENCH_WORLD_SIZE": str(n), "TMPDIR": tmp}
        scripts = {}
        for name, source in (("spawn", SPAWN_MAIN), ("torchrun", TORCHRUN_MAIN), ("ddpkit", DDPKIT_MAIN)):
            scripts[name] = os.path.join(tmp, f"hello_{name}.py")
            with open(scripts[name], "w") as f:
                f.write(source)
        py = sys.executable
        commands = {
            "ddpkit.launch (process, fork)": [py, scripts["ddpkit"]],
            "mp.spawn (process)": [py, scripts["spawn"]],
            "torchrun (process)": [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", scripts["torchrun"]],
        }
        firsts = {}
        for method in ("fork", "forkserver", "spawn"):
            times, firsts[method] = time_warm_ddpkit(n, repeats, method)
            medians[f"ddpkit.launch (warm, {method})"] = statistics.median(times)
        for label, cmd in commands.items():
            medians[label] = statistics.median(time_process(cmd, env) for _ in range(repeats))
    assert list(medians) == list(LABELS)
    return medians, firsts


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="world size 2, one repeat: proves the script runs")
    opts = parser.parse_args(argv)
    if opts.smoke:
        opts.world_size, opts.repeats = 2, 1
    n, repeats = opts.world_size, opts.repeats
    medians, firsts = measure(n, repeats)

    print(f"launch latency, world size {n}, median of {repeats} run(s), seconds "
          f"(load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    base = medians["ddpkit.launch (warm, fork)"]
    for label, seconds in medians.items():
        print(f"  {label:32} {seconds:8.3f} s   {seconds / base:7.1f}x fork (warm)")
    print(f"forkserver's one-time start (first launch, PyTorch imported in the server): {firsts['forkserver']:.2f} s")
    ratio = medians["ddpkit.launch (warm, forkserver)"] / base
    print(f"forkserver / fork (warm) = {ratio:.1f}x (goal: <= 3x)")
    print(f"torchrun / ddpkit.launch (warm, fork) = {medians['torchrun (process)'] / base:.1f}x (goal: >= 40x)")
    return medians


if __name__ == "__main__":
    main()
