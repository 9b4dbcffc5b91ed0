"""ddpkit.first_mismatch on real flight-recorder entries from real gloo ranks that desynchronised."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import ddpkit


def _desync(bug: str):
    """Each rank runs one good all_reduce, then the bug, under a 2 s group timeout; returns its record."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    sub = dist.new_group([0, 1])
    try:
        if bug == "order":  # rank 0 broadcasts while rank 1 all-gathers
            if rank == 0:
                dist.broadcast(t, src=0)
            else:
                dist.all_gather([torch.zeros(4), torch.zeros(4)], t)
        elif bug == "skip":  # rank 1 skips the second all_reduce on the subgroup
            dist.all_reduce(t, group=sub)
            if rank == 0:
                dist.all_reduce(t, group=sub)
        elif bug == "unused":  # only rank 0 evaluates on the subgroup; rank 1 never touches it
            if rank == 0:
                dist.all_reduce(t, group=sub)
        elif bug == "none":
            dist.all_reduce(t, group=sub)
            dist.barrier()
    except RuntimeError:  # gloo's timeout; the group is now unusable
        pass
    record = ddpkit.flight_record()
    dist.destroy_process_group()
    return record


def test_a_desync_is_named_with_each_ranks_call_and_line():
    records = ddpkit.launch(_desync, world_size=2, args=("order",), init_process_group=False, timeout=60)
    found = ddpkit.first_mismatch(records)
    assert (found.group, found.seq, found.reason) == ("0", 2, "the ranks called different operations")
    assert [found.calls[r].op for r in (0, 1)] == ["broadcast", "all_gather"]
    assert "dist.broadcast(t, src=0)" in found.calls[0].where and found.calls[0].where.startswith("_desync, line ")
    assert "dist.all_gather(" in found.calls[1].where
    assert str(found).splitlines()[0] == "collective #2 of process group 0 (default_pg): the ranks called different operations"


def test_a_skipped_collective_on_a_subgroup():
    records = ddpkit.launch(_desync, world_size=2, args=("skip",), init_process_group=False, timeout=60)
    found = ddpkit.first_mismatch(records)
    assert (found.group, found.seq, found.reason) == ("1", 2, "rank 1 never called it")
    assert found.calls[1] is None and found.calls[0].op == "all_reduce"
    assert "rank 1: (no call" in str(found)


def test_a_member_that_never_used_its_group():
    records = ddpkit.launch(_desync, world_size=2, args=("unused",), init_process_group=False, timeout=60)
    assert [c.group for c in records[1]] == ["0"]  # rank 1 recorded nothing in group "1"
    assert records[0][-1].group_ranks == (0, 1)
    found = ddpkit.first_mismatch(records)
    assert (found.group, found.seq, found.reason) == ("1", 1, "rank 1 never called it")


def test_ranks_that_agree_have_no_mismatch():
    records = ddpkit.launch(_desync, world_size=2, args=("none",), init_process_group=False, timeout=60)
    assert [[c.op for c in r] for r in records] == [["all_reduce", "all_reduce", "barrier"]] * 2
    assert ddpkit.first_mismatch(records) is None


def _shape_records():
    def call(seq, op, shape, dtype="Float", group="0"):
        return ddpkit.Collective(group, "default_pg", seq, op, (shape,), (shape,), (dtype,), "", "scheduled")
    return call


def test_shapes_dtypes_and_the_earliest_group_win():
    call = _shape_records()
    assert ddpkit.first_mismatch([[call(1, "all_reduce", (4,), "Float")],
                                  [call(1, "all_reduce", (4,), "Half")]]).reason == "the ranks called different dtypes"
    # group "1" diverges at the ranks' 1st entry, group "0" only at their 2nd: group "1" is reported
    rank0 = [call(1, "all_reduce", (4,), group="1"), call(1, "all_reduce", (4,)), call(2, "barrier", ())]
    rank1 = [call(1, "all_reduce", (5,), group="1"), call(1, "all_reduce", (4,)), call(2, "broadcast", (4,))]
    found = ddpkit.first_mismatch([rank0, rank1])
    assert (found.group, found.seq, found.reason) == ("1", 1, "the ranks called different shapes")
    # a ring buffer that dropped rank 1's oldest entry is not a mismatch
    assert ddpkit.first_mismatch([[call(1, "barrier", ()), call(2, "barrier", ())], [call(2, "barrier", ())]]) is None


def test_a_recorder_that_is_off_says_how_to_turn_it_on():
    def work():
        dist.all_reduce(torch.ones(1))
        return ddpkit.flight_record()

    with pytest.raises(ddpkit.RankFailedError, match="TORCH_FR_BUFFER_SIZE=0 turns it off"):
        ddpkit.launch(work, world_size=2, env={"TORCH_FR_BUFFER_SIZE": "0"}, start_method="spawn", timeout=120)
