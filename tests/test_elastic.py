"""Elastic runs under the real torchrun: a crashed worker group restarts, resumes and ends bit-for-bit the same.

The repeated crash-restart test is the proof behind ddpkit.torchrun's restart fix
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, see ddpkit/_torchrun.py): with torchrun's defaults machine 0's agent
gives the workers one TCPStore (apart from the rendezvous's own) and reuses it for every attempt, and on a busy
2-core machine some runs failed at the first restart (``Gloo connectFullMesh failed ... Connection refused``) or hung. The variable is read only by the
c10d handler: static rendezvous always shares the agent's store (tested below), and
``DDPKIT_MEASURE_STATIC=1 pytest tests/test_elastic.py -k static -s`` counts what that does to its restarts.

One PyTorch race at process exit is tolerated, by one rerun, and only with its exact signature: a run that failed
although its training finished ("finished 12 steps"), with a rank killed by SIGABRT with ``terminate called without
an active exception`` while the interpreter shut down. (The same abort also follows a rank's own exception, a
crashed attempt's rank 0, where it changes nothing.) Measured under load on 2 cores (2 busy-loop processes): 1 in 25
runs of the reference, 1 in 40 of a plain 2-rank DDP script with no ddpkit at all. With ``TORCH_CUSTOM_TERMINATE=1``
the C++ stack shows why: a gloo worker thread (``ProcessGroupGloo::runLoop``) drops its last reference to a finished
``AsyncAllreduceWork``; the work's saved ``ThreadLocalState`` holds a Python object (the ``contextvars`` context
that ``torch/autograd/graph.py:_engine_run_backward`` stashes in thread-local state during every backward, when DDP
launches its all-reduce); releasing it takes the GIL, the interpreter is already finalizing, so the thread is ended
by ``pthread_exit`` and its unwinding through a ``noexcept`` frame calls ``std::terminate``. The worker threads are
still running at exit because a ``DistributedDataParallel`` model keeps its process group alive after
``destroy_process_group()`` (in torch 2.13 the group's threads stay even after ``del model; gc.collect()``), and
gloo's workers stop only in the group's destructor. pytorch/pytorch#179291 describes the same race and was
abandoned. ddpkit.launch on Linux (fork or forkserver) does not meet it: multiprocessing ends such a child with
``os._exit``, without interpreter finalization.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import signal
import time
import warnings

import pytest
import torch

import ddpkit

pytestmark = pytest.mark.usefixtures("no_leaks")

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "06_elastic.ipynb"


def _chapter_script() -> str:
    """train.py exactly as chapter 06 writes it: one source of truth.

    The chapter writes it in parts: its ``%%writefile train.py`` cell, then the ``%%writefile -a train.py`` cells
    that append to it (IPython ends each part with a newline). Rank 0 checkpoints atomically every 3 steps, rank 1
    crashes before step 7 on the first attempt (script arguments: directory, kind of crash, step, number of attempts
    that crash), every attempt resumes from the last checkpoint (loaded with map_location="cpu"); on SIGTERM every
    rank stops at the next step, rank 0 checkpoints, and the workers exit.
    """
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    first = next(i for i, source in enumerate(cells) if source.startswith("%%writefile train.py"))
    parts = [cells[first]] + [s for s in cells[first + 1:] if s.startswith("%%writefile -a train.py")]
    return "".join(part.split("\n", 1)[1].rstrip("\n") + "\n" for part in parts)


TRAIN = _chapter_script()

RUNS = 10


EXIT_RACE = "terminate called without an active exception"  # see the module docstring


def _train(workdir: pathlib.Path, crash: str, *extra: str) -> tuple[int, str, str, dict]:
    status, out, err, final = _train_once(workdir, crash, *extra)
    if status != 0 and EXIT_RACE in err and "finished 12 steps" in out:  # the training ended, the exit raced: again
        warnings.warn(f"PyTorch's exit race (see tests/test_elastic.py's docstring), run again:\n{err}", stacklevel=2)
        status, out, err, final = _train_once(workdir, crash, *extra)
    return status, out, err, final


def _train_once(workdir: pathlib.Path, crash: str, *extra: str, agent_log: str | list = "hide",
                ) -> tuple[int, str, str, dict]:
    for name in ("checkpoint.pt", "final.pt", "events.jsonl"):
        with contextlib.suppress(FileNotFoundError):
            (workdir / name).unlink()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = ddpkit.torchrun(TRAIN, "--standalone", "--nproc_per_node=2", *extra,
                                 script_args=[workdir, crash], timeout=150, agent_log=agent_log,
                                 # DDP makes torch create a compiler cache dir in TMPDIR: keep it in ours
                                 env={"TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")})
    final = torch.load(workdir / "final.pt", map_location="cpu") if status == 0 else {}
    return status, out.getvalue(), err.getvalue(), final


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    status, out, err, final = _train(workdir, "none")
    assert status == 0, f"{out}\nstderr:\n{err}"
    assert out.splitlines() == [
        "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)",
        f"[rank0]: finished 12 steps, loss {out.split('loss ')[-1].strip()}",
    ]
    return final


@pytest.mark.parametrize("run", range(RUNS))
def test_crash_restart_resume_is_reliable_and_bit_exact(run, reference, tmp_path):
    crash = ("raise", "exit", "kill")[run % 3]
    # one restart only: a first restart that failed (e.g. connectFullMesh on stale keys) must fail the run,
    # not be rescued by a second one
    status, out, err, final = _train(tmp_path, crash, "--max-restarts=1")
    assert status == 0, f"run {run} ({crash}) failed:\n{out}\nstderr:\n{err}"
    lines = out.splitlines()
    assert lines[:2] == [
        "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)",
        "[rank0]: attempt 1: world size 2, starting at step 6 (epoch 1, batch 2)",
    ], out
    assert not any("attempt 2:" in line for line in lines), out
    assert final.keys() == reference.keys()
    for name, tensor in final.items():
        assert torch.equal(tensor, reference[name]), name  # bit for bit, not approximately


def test_without_restarts_the_crash_ends_the_run(tmp_path):
    status, out, _, _ = _train(tmp_path, "raise")  # --max-restarts defaults to 0
    assert status == 1
    assert out.splitlines() == ["[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)"]
    assert torch.load(tmp_path / "checkpoint.pt", map_location="cpu")["step"] == 6  # the last checkpoint stays: a new run on this directory would resume


STORE_PROBE = '''
import os, sys, datetime, torch.distributed as dist
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
if rank == 0:
    with open(os.path.join(sys.argv[1], "ports"), "a") as f:
        print(os.environ["MASTER_PORT"], os.environ["TORCHELASTIC_USE_AGENT_STORE"], file=f)
if attempt == 1:
    if rank == 0 and os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True":
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=10))
        # rank 0 of the default group's gloo context publishes its address under this key (torch 2.13)
        print("before init, rank 0's gloo address is already in the store:", store.check(["default_pg/0//cpu//0/0"]))
    sys.exit(0)  # the evidence is in; stop before the stale keys can break anything
dist.init_process_group("gloo")
dist.barrier()
if rank == 1:
    os._exit(3)
try:
    dist.barrier()  # rank 0 fails here when rank 1 is gone (or its agent stops it first)
except RuntimeError:
    sys.exit(1)
'''
STANDALONE = ("--standalone", "--nproc_per_node=2")
STATIC = ("--nnodes=2", "--nproc_per_node=1", "--node_rank={node_rank}", "--master_addr=127.0.0.1", "--master_port={port}")


def _probe(tmp_path, share: str, where: tuple, nodes: int) -> tuple[list[list[str]], str]:
    status = ddpkit.torchrun(STORE_PROBE, *where, "--max-restarts=1", nodes=nodes, script_args=[tmp_path],
                             env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": share}, timeout=120, agent_log="hide")
    assert status == 0
    return [line.split() for line in (tmp_path / "ports").read_text().splitlines()], status


@pytest.mark.parametrize("share", ["0", "1"])
def test_the_root_cause_one_store_for_every_attempt(share, tmp_path, capfd):
    """Stock torchrun (share=0 here means sharing on) keeps the agent's store across restarts."""
    (first, use_first), (second, use_second) = _probe(tmp_path, share, STANDALONE, 1)[0]
    out, _ = capfd.readouterr()
    if share == "0":  # stock: the same store, still holding the dead attempt's gloo addresses
        assert first == second and use_first == use_second == "True"
        assert "[rank0]: before init, rank 0's gloo address is already in the store: True" in out
    else:  # ddpkit's default: a fresh store on a fresh port for every attempt
        assert first != second and use_first == use_second == "False"
        assert "already in the store" not in out


@pytest.mark.parametrize("share", ["0", "1"])
def test_static_rendezvous_shares_one_store_whatever_the_variable(share, tmp_path, capfd):
    """Only the c10d handler reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE: static always uses the agent's store."""
    (first, use_first), (second, use_second) = _probe(tmp_path, share, STATIC, 2)[0]
    out, _ = capfd.readouterr()
    assert first == second and use_first == use_second == "True"
    assert "[rank0]: before init, rank 0's gloo address is already in the store: True" in out


STATIC_RUNS = 10


@pytest.mark.skipif(os.environ.get("DDPKIT_MEASURE_STATIC") != "1",
                    reason="a measurement (20 runs of up to 2 minutes): set DDPKIT_MEASURE_STATIC=1 and run with -s")
@pytest.mark.parametrize("share", ["0", "1"])
def test_static_restarts_measured(share, tmp_path):
    """Count how static-rendezvous crash-restart runs end: 2 agents x 1 worker, crash before step 7, 2 restarts."""
    counts = {"finished": 0, "needed a 2nd restart": 0, "failed": 0, "timed out": 0}
    for run in range(STATIC_RUNS):
        workdir = tmp_path / f"run{run}"
        workdir.mkdir()
        out, err = io.StringIO(), io.StringIO()
        start, load = time.monotonic(), os.getloadavg()[0]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = ddpkit.torchrun(TRAIN, *STATIC, "--max-restarts=2", nodes=2, script_args=[workdir, "raise"],
                                         timeout=150, agent_log="hide",
                                         env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": share,
                                              "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")})
        except TimeoutError:
            status = None
        mesh = "Gloo connectFullMesh failed" in err.getvalue()
        counts["timed out" if status is None else "failed" if status else "finished"] += 1
        counts["needed a 2nd restart"] += "attempt 2:" in out.getvalue()
        print(f"share={share} run {run}: status {status}, connectFullMesh failure seen: {mesh}, "
              f"{time.monotonic() - start:.0f} s, load {load:.1f}", flush=True)
        assert "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)" in out.getvalue()
    print(f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={share}, {STATIC_RUNS} static runs: {counts}")


def test_sigterm_to_the_agent_checkpoints_at_the_next_step_and_a_new_run_resumes_bit_exact(reference, tmp_path):
    """A preemption: rank 1 sends SIGTERM to its agent before step 7; the agent forwards it to both workers.

    Both ranks stop at the same step (they agree with an all_reduce of the flag), rank 0 checkpoints, the
    workers exit; torchrun exits with status 1 without using its restart budget (the agent re-raises its
    SignalException). A new torchrun on the same directory resumes at step 7 and ends with the reference weights.
    """
    stopped = [
        "[rank0]: attempt 0: world size 2, starting at step 0 (epoch 0, batch 0)",
        "[rank0]: SIGTERM received; stopped before step 7",
        "[rank1]: SIGTERM received; stopped before step 7",
    ]
    agent: list[str] = []
    status, out, err, _ = _train_once(tmp_path, "preempt", "--max-restarts=2", agent_log=agent)
    if status == -signal.SIGABRT and out.splitlines() == stopped:
        # Seen once on CI (2.14.1 CUDA wheel, busy 2-core machine): the workers stopped and checkpointed,
        # then the agent itself died of SIGABRT while exiting. Not reproduced in 12 runs under load here, so the
        # agent's log is kept; the same abort twice in a row fails the test.
        warnings.warn("the agent died of SIGABRT after its workers stopped; run again. Agent log:\n"
                      + "\n".join(agent[-40:]), stacklevel=1)
        agent = []
        status, out, err, _ = _train_once(tmp_path, "preempt", "--max-restarts=2", agent_log=agent)
    assert status == 1, f"{out}\nstderr:\n{err}\nagent log:\n" + "\n".join(agent[-60:])
    assert out.splitlines() == stopped, out
    saved = torch.load(tmp_path / "checkpoint.pt", map_location="cpu")
    assert (saved["step"], saved["epoch"], saved["batch"]) == (7, 1, 3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = ddpkit.torchrun(TRAIN, *STANDALONE, script_args=[tmp_path, "none"], timeout=150, agent_log="hide",
                                 env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert out.getvalue().splitlines()[0] == "[rank0]: attempt 0: world size 2, starting at step 7 (epoch 1, batch 3)"
    final = torch.load(tmp_path / "final.pt", map_location="cpu")  # written before the exit (and its rare race)
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)
