"""Where do DDP's measured steps fall against the alpha-beta model's band? The full bucket_cap_mb sweep of chapter 12.

Chapter 12 (section 3) times 3 bucket settings of one MLP; this script runs the long sweep: the digits MLP of 8
hidden layers at several widths, DDP under several ``bucket_cap_mb`` values, 2 ranks on gloo. For each it prints
the computation alone (the same steps under ``no_sync``), the model's perfect-overlap and no-overlap step times
(alpha and beta fitted to ``all_reduce`` at 2 ranks first, as in the chapter's section 1), the measured DDP step,
its ratio to the no-overlap end, and where it fell: below, inside or above the band. Last, how much of the
machine's CPU time other programs took meanwhile (``ddpkit.cpu_use``): read the figures only when that is small.

Run by hand:   python benchmarks/bucket_sweep.py [--widths 256 512 1024] [--steps 10]
Smoke mode:    python benchmarks/bucket_sweep.py --smoke   (width 512, bucket_cap_mb 1, 2 steps; used by the tests)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

MiB = 1 << 20
FIT = [4 << 10, 16 << 10, 64 << 10, MiB, 16 * MiB, 32 * MiB]
CAPS = [1, 2, 4, 25, None]


def ring_time(nbytes, n, alpha, beta):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def fit_ring(rows, n):
    import numpy as np

    S, t = np.array([r.nbytes for r in rows], dtype=float), np.array([r.seconds for r in rows])
    design = np.stack([np.full_like(S, 2 * (n - 1)), 2 * (n - 1) / n * S], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


def step_times(width, caps, steps, batch=32, depth=8):
    # in a rank: per cap, the slower rank's median DDP step and no_sync step, and DDP's rebuilt buckets' bytes
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddpkit

    rank, data = dist.get_rank(), ddpkit.load_digits()
    x, y = data.x_train[rank * batch:(rank + 1) * batch], data.y_train[rank * batch:(rank + 1) * batch]
    out = {}
    for cap in caps:
        model = DDP(ddpkit.digits_mlp(hidden=width, depth=depth, seed=0), bucket_cap_mb=cap)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        for _ in range(3):                                   # the buckets are rebuilt after the first step
            step()
        timed = {"ddp": [], "compute": []}
        for _ in range(steps):
            for kind, times in timed.items():
                dist.barrier()
                start = time.perf_counter()
                if kind == "ddp":
                    step()
                else:
                    with model.no_sync():
                        step()
                times.append(time.perf_counter() - start)
        medians = torch.tensor([statistics.median(timed["ddp"]), statistics.median(timed["compute"])],
                               dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
        buckets = [int(b) for b in model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
        out[cap] = {"ddp": medians[0].item(), "compute": medians[1].item(), "buckets": buckets}
    return out


def main(argv=None) -> int:
    import ddpkit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    widths, caps, steps, repeats = (([512], [1], 2, 3) if args.smoke else (args.widths, CAPS, args.steps, 11))

    sizes = [4 << 10, 64 << 10, MiB, 4 * MiB] if args.smoke else FIT

    def run():
        rows = ddpkit.collective_bandwidth("all_reduce", world_sizes=(2,), sizes=sizes, repeats=repeats, statistic="min")
        return rows, {w: ddpkit.launch(step_times, 2, args=(w, caps, steps), timeout=600)[0] for w in widths}

    (rows, sweeps), use = ddpkit.cpu_use(run)
    alpha, beta = fit_ring(rows, 2)
    print(f"bucket sweep, 2 ranks, {steps} steps per setting; alpha = {alpha * 1e6:.0f} us, "
          f"1/beta = {1 / beta / 1e9:.2f} GB/s (all_reduce fitted at 2 ranks)")
    print(f"{'width':>5} {'bucket_cap_mb':>13} {'buckets':>7} {'computation ms':>14} {'perfect overlap ms':>18} "
          f"{'no overlap ms':>13} {'measured ms':>11} {'/ no overlap':>12}  band")
    where = []
    for width, sweep in sweeps.items():
        for cap, r in sweep.items():
            comm = [ring_time(b, 2, alpha, beta) for b in r["buckets"]]
            low, high = max(r["compute"] + comm[-1], sum(comm)), r["compute"] + sum(comm)
            where.append("below" if r["ddp"] < low else "inside" if r["ddp"] <= high else "above")
            print(f"{width:>5} {str(cap):>13} {len(r['buckets']):>7} {r['compute'] * 1e3:>14.1f} {low * 1e3:>18.1f} "
                  f"{high * 1e3:>13.1f} {r['ddp'] * 1e3:>11.1f} {r['ddp'] / high:>12.2f}  {where[-1]}")
    print(f"settings below the band: {where.count('below')}, inside: {where.count('inside')}, "
          f"above: {where.count('above')}")
    print(f"other programs took {use.others_share:.0%} of the {use.cores} cores during these {use.wall:.1f} s "
          f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
