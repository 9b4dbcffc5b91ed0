"""ddpkit._cluster: the mesh helpers, the traffic recorder and the link model of chapter 10."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import ddpkit


def _record_on_a_2x2_mesh():
    mesh = ddpkit.quiet_mesh((2, 2), ("dp", "tp"))
    peer = dist.get_rank() ^ 1
    with ddpkit.Traffic() as traffic:
        dist.all_reduce(torch.ones(5), group=mesh.get_group("tp"))
        if dist.get_rank() % 2 == 0:
            dist.send(torch.ones(2, dtype=torch.float64), peer)
        else:
            dist.recv(torch.empty(2, dtype=torch.float64), peer)
        dist.barrier()                                   # not a recorded kind: lands in `other`
    return traffic.seen, traffic.other


def test_traffic_records_kind_group_numbers_and_bytes_of_each_operation():
    results = ddpkit.launch(_record_on_a_2x2_mesh, 4)
    assert results[2][0] == [("all-reduce", (2, 3), 5, 4), ("send", (2, 3), 2, 8)]
    assert results[3][0] == [("all-reduce", (2, 3), 5, 4), ("recv", (2, 3), 2, 8)]
    assert all(other == ["barrier"] for _, other in results)


def test_group_link_spreads_a_group_over_the_adapters_of_its_gpus_on_each_machine():
    assert ddpkit.group_link((0, 1, 2, 3), 4) == ("NVLink", 450e9)
    assert ddpkit.group_link(range(16), 8) == ("InfiniBand x8", 400e9)           # 8 GPUs, 8 adapters per machine
    assert ddpkit.group_link(range(8), 4) == ("InfiniBand x4", 200e9)
    assert ddpkit.group_link(range(5, 128, 8), 8) == ("InfiniBand", 50e9)       # one GPU per machine
    assert ddpkit.group_link(range(32), 8, nvlink=300e9) == ("InfiniBand x8", 300e9)   # capped by NVLink
    assert ddpkit.group_link((0, 8), 8, adapter=25e9) == ("InfiniBand", 25e9)


def test_plan_table_has_one_line_per_row_and_a_dash_for_a_group_of_one():
    rows = [{"dim": "pp", "role": "pp", "group": (0,), "machines": [0], "link": "NVLink", "counts": {},
             "bytes": 0, "seconds": 0.0},
            {"dim": "dp", "role": "dp_shard", "group": (0, 8), "machines": [0, 1], "link": "InfiniBand",
             "counts": {"all-gather": 2, "reduce-scatter": 1}, "bytes": 3e9, "seconds": 0.06}]
    lines = ddpkit.plan_table(rows).splitlines()
    assert len(lines) == 3 and lines[1].split()[:6] == ["pp", "pp", "1", "1", "—", "nothing"]
    assert lines[2].split()[-2:] == ["3.000", "0.060"]


def test_the_pictures_are_figures_without_pyplot():
    plt.close("all")
    ranks = [{"coordinate": divmod(r, 2), "dp": (r % 2, r % 2 + 2), "tp": (r // 2 * 2, r // 2 * 2 + 1)}
             for r in range(4)]
    fig = ddpkit.plot_mesh_groups([("a", ("dp", "tp"), ranks), ("b", ("dp", "tp"), ranks)])
    assert len(fig.axes) == 2 and [t.get_text() for t in fig.axes[0].texts][0] == "rank 0\n(0, 0)"
    big = ddpkit.plot_cluster_groups((4, 64, 8), ("pp", "dp", "tp"), 8, 0,
                                     [(0, 512, 1024, 1536), tuple(range(0, 512, 8)), tuple(range(8))])
    assert "one cell per machine" in big.axes[0].get_title()
    small = ddpkit.plot_cluster_groups((2, 2), ("dp", "tp"), 2, 3, [(1, 3), (2, 3)])
    assert "one cell per GPU" in small.axes[0].get_title()
    assert plt.get_fignums() == []
