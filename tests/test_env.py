"""DistEnv, dist_env, setup_distributed and torchrun_environ: the course's view of the launcher's variables."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import ddpkit
from ddpkit import dist_env, patched_environ, torchrun_environ


def test_classic_defaults_when_nothing_is_set():
    env = dist_env({})
    assert (env.local_rank, env.rank, env.world_size) == (-1, -1, 1)
    assert env.launcher == "none" and not env.is_distributed and env.is_main
    assert env.device == torch.device("cpu") and env.backend == "gloo"


@pytest.mark.parametrize(
    "variables, launcher",
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"}, "torchrun"),
        ({"RANK": "0", "WORLD_SIZE": "2", "DDPKIT_LAUNCHED": "1"}, "ddpkit"),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, "manual"),
        ({"WORLD_SIZE": "1"}, "manual"),
    ],
)
def test_launcher_is_recognised(variables, launcher):
    assert dist_env(variables).launcher == launcher


def test_fields_follow_the_torchrun_variables():
    env = dist_env(torchrun_environ(rank=6, world_size=8, nnodes=2, master_port=1234) | {"TORCHELASTIC_RESTART_COUNT": "2"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (6, 2, 8, 4)
    assert (env.node_rank, env.nnodes, env.master_addr, env.master_port, env.restart_count) == (1, 2, "127.0.0.1", 1234, 2)
    assert not env.is_main and env.is_distributed


def test_a_non_numeric_variable_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"RANK='zero' is not an integer. Unset it or set it to a number"):
        dist_env({"RANK": "zero"})


def test_torchrun_environ_numbers_machine_by_machine():
    table = [torchrun_environ(r, 8, nnodes=2) for r in range(8)]
    assert [(e["GROUP_RANK"], e["LOCAL_RANK"]) for e in table] == [(str(r // 4), str(r % 4)) for r in range(8)]
    with pytest.raises(ValueError, match="multiple of nnodes"):
        torchrun_environ(0, 6, nnodes=4)
    with pytest.raises(ValueError, match="rank=8 must be in 0..7"):
        torchrun_environ(8, 8)


def test_patched_environ_restores_even_after_an_error(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(RuntimeError):
        with patched_environ({"RANK": "1", "LOCAL_RANK": "1"}):
            assert os.environ["RANK"] == "1"
            raise RuntimeError("boom")
    assert os.environ["RANK"] == "5" and "LOCAL_RANK" not in os.environ
    with patched_environ({"RANK": None}):
        assert "RANK" not in os.environ
    assert os.environ["RANK"] == "5"


def test_setup_distributed_is_harmless_in_a_plain_process():
    env = ddpkit.setup_distributed()
    assert not env.is_distributed and not dist.is_initialized()


def test_setup_distributed_under_manual_variables_initialises_a_real_group():
    # a world of one, set up by hand: the classic env:// path, for real
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    variables = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with patched_environ(variables):
        try:
            env = ddpkit.setup_distributed(timeout=10)
            assert dist.is_initialized() and dist.get_backend() == "gloo" and env.launcher == "manual"
            assert ddpkit.setup_distributed() == env  # idempotent
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def test_setup_distributed_refuses_nccl_without_gpus():
    if ddpkit.gpu_count() > 0:
        pytest.skip("this machine has a GPU")
    with patched_environ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}):
        with pytest.raises(RuntimeError, match="needs one GPU per local rank.*without backend="):
            ddpkit.setup_distributed(backend="nccl")


def test_rank_table_has_one_line_per_rank_and_aligned_columns():
    rows = [{k: int(torchrun_environ(r, 8, nnodes=2)[k]) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")}
            for r in range(8)]
    lines = ddpkit.rank_table(rows).splitlines()
    assert lines[0].split() == ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE"]
    assert [line.split() for line in lines[1:]] == [[str(r), str(r % 4), str(r // 4), "8"] for r in range(8)]
    assert len({len(line) for line in lines}) == 1  # right-aligned: every line equally long
    with pytest.raises(ValueError, match="empty"):
        ddpkit.rank_table([])
