"""Do ranks exit when they destroy the process group while a DDP model still holds it?

The ending every cluster script has (chapter 04's skeleton)::

    dist.barrier()
    dist.destroy_process_group()
    return results            # the DDP model is freed here, after the group

used to leave a rank stuck forever now and then: the DDP ``Reducer`` freed the
last reference to the gloo group with the GIL held, ``~ProcessGroupGloo``
joined its worker threads, and one of them was waiting for the GIL to free a
finished collective (see ``ddpkit._env.hold_group``, PyTorch issue #56297).
``ddpkit`` now keeps a reference to the group so that the Reducer never frees
it; this script counts hung runs with that reference and, with
``--without-hold``, without it (the bug, reproduced).

Each run is one ``ddpkit.launch`` of a few DDP training steps on the digits,
ended as above; a run that does not finish within ``--timeout`` seconds is a
hang (the launcher then shows every rank's stack and cleans up).

Run by hand:   python benchmarks/ddp_exit_stress.py [--runs 100] [--world-size 2] [--without-hold]
Smoke mode:    python benchmarks/ddp_exit_stress.py --smoke   (3 runs; used by the tests)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ddpkit  # noqa: E402


def train(steps: int = 5) -> int:
    """Chapter 04's ending: train, barrier, destroy the group, return with the DDP model still alive."""
    env = ddpkit.setup_distributed()
    data = ddpkit.load_digits()
    model = DDP(ddpkit.digits_mlp(hidden=64, seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        x, y = data.x_train[i * 32:(i + 1) * 32], data.y_train[i * 32:(i + 1) * 32]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    return env.rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--start-method", default="auto", choices=["auto", "fork", "forkserver", "spawn"])
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds after which a run counts as hung")
    parser.add_argument("--without-hold", action="store_true",
                        help="switch ddpkit's reference to the group off, to reproduce the hang")
    parser.add_argument("--smoke", action="store_true", help="3 runs (the tests use this)")
    args = parser.parse_args(argv)
    runs = 3 if args.smoke else args.runs
    if args.without_hold:  # every rank inherits the variable, whatever the start method
        os.environ["DDPKIT_HOLD_GROUP"] = "0"
    hung, failed, seconds = [], [], []
    for i in range(runs):
        start = time.perf_counter()
        try:
            ddpkit.launch(train, args.world_size, start_method=args.start_method, timeout=args.timeout)
            seconds.append(time.perf_counter() - start)
        except ddpkit.LaunchTimeoutError as exc:
            hung.append(i)
            print(f"run {i}: hung; {str(exc).splitlines()[0]}", flush=True)
        except ddpkit.RankFailedError as exc:
            failed.append(i)
            print(f"run {i}: failed; {str(exc).splitlines()[0]}", flush=True)
    hold = "off (--without-hold)" if args.without_hold else "on"
    median = f"{statistics.median(seconds):.2f} s" if seconds else "n/a"
    print(f"ddp exit stress: {runs} runs, world size {args.world_size}, start method {args.start_method}, "
          f"ddpkit's hold on the group {hold}, torch {torch.__version__}")
    print(f"hung: {len(hung)} of {runs}; failed otherwise: {len(failed)}; median finished run {median}; "
          f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 1 if (failed or (hung and not args.without_hold)) else 0


if __name__ == "__main__":
    sys.exit(main())
