"""ddpkit._bench: the bandwidth probe, run for real in gloo process groups."""

from __future__ import annotations

import pytest

import ddpkit
from ddpkit import size_meaning
from ddpkit._bench import OPS, _human, default_sizes, main

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_bus_factor_follows_nccl_tests():
    assert ddpkit.bus_factor("all_reduce", 2) == 1.0
    assert ddpkit.bus_factor("all_reduce", 8) == 2 * 7 / 8
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert ddpkit.bus_factor(op, 4) == 0.75
    for op in ("broadcast", "reduce", "copy"):
        assert ddpkit.bus_factor(op, 4) == 1.0
    with pytest.raises(ValueError, match="unknown op"):
        ddpkit.bus_factor("allreduce", 2)


def test_row_computes_bandwidths_in_gigabytes_per_second():
    row = ddpkit.BandwidthRow("all_gather", 4, 8_000_000, 0.004)
    assert row.algbw == pytest.approx(2.0)
    assert row.busbw == pytest.approx(1.5)
    assert row.as_dict() == {
        "op": "all_gather", "world_size": 4, "nbytes": 8_000_000, "seconds": 0.004,
        "algbw": pytest.approx(2.0), "busbw": pytest.approx(1.5),
    }


def test_size_meaning_follows_nccl_tests_and_rejects_unknown_ops():
    assert size_meaning("all_reduce") == "the tensor each rank reduces"
    assert "gathered output" in size_meaning("all_gather")
    with pytest.raises(ValueError, match="unknown op"):
        size_meaning("allgather")


def test_default_sizes_span_1_kib_to_64_mib_in_steps_of_4():
    sizes = default_sizes()
    assert sizes[0] == 1024 and sizes[-1] == 64 << 20
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:]))


def test_all_reduce_sweep_returns_one_row_per_world_size_and_size():
    sizes = [4096, 16 << 20]
    rows = ddpkit.collective_bandwidth("all_reduce", world_sizes=(2, 3), sizes=sizes, repeats=2)
    assert [(r.op, r.world_size) for r in rows] == [("all_reduce", 2)] * 2 + [("all_reduce", 3)] * 2
    # sizes are rounded down to whole float32 elements that split evenly over the ranks
    assert [r.nbytes for r in rows] == [4096, 16 << 20, 4092, 16777212]
    for r in rows:
        assert r.seconds > 0
        assert r.busbw == pytest.approx(r.algbw * ddpkit.bus_factor("all_reduce", r.world_size))
    for world_size in (2, 3):
        small, large = [r for r in rows if r.world_size == world_size]
        # 4096x more data cannot take less time, and latency dominates the small one
        assert large.seconds > small.seconds
        assert large.busbw > small.busbw


@pytest.mark.parametrize("op", OPS)
def test_every_op_runs(op):
    (row,) = ddpkit.collective_bandwidth(op, world_sizes=(2,), sizes=[4096], repeats=1)
    assert (row.op, row.world_size, row.nbytes) == (op, 2, 4096)
    assert row.seconds > 0


def test_copy_reference_is_one_process_and_grows_with_size():
    small, large = ddpkit.copy_bandwidth(sizes=[4096, 16 << 20], repeats=2)
    assert (small.op, small.world_size, small.nbytes) == ("copy", 1, 4096)
    assert large.nbytes == 16 << 20
    assert large.seconds > small.seconds > 0
    assert large.busbw == large.algbw


def test_copy_is_faster_than_gloo_over_loopback():
    size = [1 << 20]
    (copy,) = ddpkit.copy_bandwidth(sizes=size, repeats=3)
    (reduce,) = ddpkit.collective_bandwidth("all_reduce", world_sizes=(2,), sizes=size, repeats=3)
    assert copy.busbw > reduce.busbw


def test_min_statistic_keeps_the_fastest_repeat():
    (row,) = ddpkit.collective_bandwidth("all_reduce", world_sizes=(2,), sizes=[1 << 20], repeats=3, statistic="min")
    (copy,) = ddpkit.copy_bandwidth(sizes=[1 << 20], repeats=3, statistic="min")
    assert row.seconds > 0 and copy.seconds > 0
    with pytest.raises(ValueError, match="statistic must be 'median'"):
        ddpkit.copy_bandwidth(sizes=[1024], statistic="mean")


def test_sizes_rounded_down_by_a_few_bytes_still_read_as_their_unit():
    assert [_human(n) for n in (1024, 1048572, 4194300, 16777212, 1000)] == ["1 KiB", "1 MiB", "4 MiB", "16 MiB", "1000 B"]


def test_bad_arguments_fail_before_launching():
    with pytest.raises(ValueError, match="unknown op"):
        ddpkit.collective_bandwidth("allreduce")
    with pytest.raises(ValueError, match="sizes"):
        ddpkit.collective_bandwidth(sizes=[])
    with pytest.raises(ValueError, match="sizes"):
        ddpkit.copy_bandwidth(sizes=[2])
    with pytest.raises(ValueError, match="repeats"):
        ddpkit.copy_bandwidth(sizes=[1024], repeats=0)


def test_table_has_a_header_and_a_line_per_row():
    rows = [ddpkit.BandwidthRow("all_reduce", 4, 64 << 20, 0.1), ddpkit.BandwidthRow("copy", 1, 1024, 1e-6)]
    lines = ddpkit.bandwidth_table(rows).splitlines()
    assert lines[0].split() == ["op", "ranks", "size", "time", "us", "algbw", "GB/s", "busbw", "GB/s"]
    assert lines[1].split() == ["all_reduce", "4", "64", "MiB", "100000.0", "0.671", "1.007"]
    assert lines[2].split() == ["copy", "1", "1", "KiB", "1.0", "1.024", "1.024"]


def test_command_line_prints_the_sweep_and_the_copy(capsys):
    rows = main(["--world-sizes", "2", "--max-mb", "1", "--repeats", "1", "--statistic", "min"])
    out = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 * len(default_sizes(largest=1 << 20)) == len(out) - 1
    assert {r.op for r in rows} == {"all_reduce", "copy"}
    assert out[1].split()[:2] == ["all_reduce", "2"] and out[-1].split()[:2] == ["copy", "1"]


def test_check_timing_measures_again_and_only_excuses_a_busy_machine(monkeypatch, capsys):
    import os

    calls = []

    def measure():
        calls.append(1)
        return len(calls)

    def claims(n):
        return [] if n >= 2 else [f"run {n} too slow"]

    assert ddpkit.check_timing(measure, claims) == 2 and len(calls) == 2      # the second measurement held
    never = lambda _: ["never holds"]  # noqa: E731
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    with pytest.raises(AssertionError, match="quiet machine: never holds"):
        ddpkit.check_timing(measure, never)
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0, 100.0, 100.0))
    assert ddpkit.machine_busy()
    ddpkit.check_timing(measure, never, attempts=2)
    assert "are not checked in this run: never holds" in capsys.readouterr().out
    with pytest.raises(ValueError, match="attempts"):
        ddpkit.check_timing(measure, never, attempts=0)


def test_cpu_use_counts_the_ranks_a_launch_forked_as_ours(monkeypatch):
    import time

    import ddpkit._bench

    def spin(seconds=0.3):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    _, use = ddpkit.cpu_use(ddpkit.launch, spin, 2)
    assert use.ours >= 0.5                      # both ranks' CPU time: children this process waited for
    assert use.machine >= 0 and use.cores >= 1 and use.wall > 0
    # the arithmetic, with the machine's counters replaced: others are the machine's busy time that is not ours
    machine, ours = iter([100.0, 104.0]), iter([10.0, 11.0])
    monkeypatch.setattr(ddpkit._bench, "_machine_busy_seconds", lambda: next(machine))
    monkeypatch.setattr(ddpkit._bench, "_our_seconds", lambda: next(ours))
    _, use = ddpkit.cpu_use(lambda: None)
    assert (use.machine, use.ours, use.others) == (4.0, 1.0, 3.0)
    assert ddpkit.CpuUse(wall=1.0, ours=2.0, machine=1.5, cores=2).others == 0.0   # clock ticks: never negative


def test_cpu_use_counts_a_forkservers_ranks_as_ours():
    import time

    def spin(seconds=0.3):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    ddpkit.launch(spin, 2, args=(0.0,), start_method="forkserver")     # the server starts outside the measurement
    _, use = ddpkit.cpu_use(ddpkit.launch, spin, 2, start_method="forkserver")
    assert use.ours >= 0.5                      # both ranks' CPU time: reaped by the server, a live child of ours


def test_every_size_is_warmed_up_with_untimed_loops_before_it_is_timed():
    from ddpkit._bench import _MAX_ITERS, _WARMUP_LOOPS, _time

    calls = []
    _time(lambda: calls.append(1), nbytes=1024, repeats=2)  # a small size: _MAX_ITERS calls per loop
    assert len(calls) == (_WARMUP_LOOPS + 2) * _MAX_ITERS
    calls.clear()
    _time(lambda: calls.append(1), nbytes=64 << 20, repeats=2)  # a large size: one call per loop
    assert len(calls) == _WARMUP_LOOPS + 2


def test_a_launch_settles_for_the_same_number_of_calls_on_every_rank():
    from ddpkit._bench import _settle

    counts = ddpkit.launch(_settle, world_size=3, args=(0.05,))
    assert counts[0] > 1 and counts == [counts[0]] * 3  # every rank stopped at the same call
