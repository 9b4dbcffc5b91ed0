"""The contract of ddpkit.launch, run for real: real processes, real gloo process groups."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ddpkit
from ddpkit._launch import _choose_start_method

from support import in_notebook, snapshot

pytestmark = pytest.mark.usefixtures("no_leaks")


# --------------------------------------------------------------------------- results and environment


def test_returns_per_rank_values_in_rank_order_with_a_working_group():
    def work():
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return dist.get_rank(), dist.get_world_size(), dist.get_backend(), t.item()

    assert ddpkit.launch(work, world_size=4) == [(r, 4, "gloo", 10.0) for r in range(4)]


def test_passes_args_and_kwargs():
    def work(a, b, *, c):
        return a + b + c + dist.get_rank()

    assert ddpkit.launch(work, 3, args=(1, 2), kwargs={"c": 10}) == [13, 14, 15]


def test_notebook_style_callables_travel_and_come_back():
    cell = """
import torch
SCALE = 3.0

class Point:
    def __init__(self, x):
        self.x = x
    def scaled(self):
        return Point(self.x * SCALE)

def make_closure(offset):
    def inner():
        import os
        return Point(int(os.environ["RANK"]) + offset).scaled()
    return inner

square = lambda: {"t": torch.arange(3) ** 2}
"""
    nb = in_notebook(cell)
    Point, closure, lam = nb["Point"], nb["make_closure"](10), nb["square"]

    points = ddpkit.launch(closure, 2, init_process_group=False)
    assert [p.x for p in points] == [30.0, 33.0]
    assert all(isinstance(p, Point) for p in points)  # the notebook's own class, not a copy

    out = ddpkit.launch(lam, 2, init_process_group=False)
    assert all(torch.equal(o["t"], torch.tensor([0, 1, 4])) for o in out)

    method = Point(7.0).scaled  # a bound method of a notebook class instance
    assert [p.x for p in ddpkit.launch(method, 2, init_process_group=False)] == [21.0, 21.0]


def test_each_rank_gets_the_torchrun_environment_for_two_simulated_machines():
    names = ddpkit._env.TORCHRUN_VARIABLES
    envs = ddpkit.launch(lambda: {k: os.environ.get(k) for k in names}, 8, nnodes=2, init_process_group=False)
    port = envs[0]["MASTER_PORT"]
    for rank, e in enumerate(envs):
        assert e == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % 4),
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": str(rank // 4),
            "GROUP_WORLD_SIZE": "2",
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "8",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
        }
    assert 1024 <= int(port) < 65536


def test_env_adds_overrides_and_removes_variables(monkeypatch):
    monkeypatch.setenv("DDPKIT_TEST_REMOVE_ME", "x")

    def read():
        return (os.environ.get("EXTRA"), os.environ["MASTER_ADDR"], os.environ.get("DDPKIT_TEST_REMOVE_ME"))

    env = {"EXTRA": 42, "MASTER_ADDR": "localhost", "DDPKIT_TEST_REMOVE_ME": None}
    assert ddpkit.launch(read, 2, init_process_group=False, env=env) == [("42", "localhost", None)] * 2
    assert os.environ["DDPKIT_TEST_REMOVE_ME"] == "x"  # the parent's environment is untouched


def test_children_default_to_one_thread_and_env_can_raise_it():
    assert ddpkit.launch(torch.get_num_threads, 2, init_process_group=False) == [1, 1]
    assert ddpkit.launch(torch.get_num_threads, 2, init_process_group=False, env={"OMP_NUM_THREADS": "2"}) == [2, 2]


def test_setup_distributed_inside_launch_without_a_launcher_group():
    def train():
        env = ddpkit.setup_distributed()
        t = torch.ones(1)
        dist.all_reduce(t)
        return env.launcher, env.rank, env.device.type, dist.get_backend(), t.item()

    assert ddpkit.launch(train, 2, init_process_group=False) == [("ddpkit", r, "cpu", "gloo", 2.0) for r in range(2)]


def test_init_process_group_false_leaves_the_group_to_fn():
    assert ddpkit.launch(dist.is_initialized, 2, init_process_group=False) == [False, False]
    assert ddpkit.launch(dist.is_initialized, 2) == [True, True]


def test_fork_after_parent_ran_multithreaded_op_does_not_deadlock():
    torch.set_num_threads(2)
    x = torch.randn(1024, 1024)
    (x @ x).sum()  # the parent's OpenMP pool is now busy-initialised

    def work():
        y = torch.randn(512, 512)
        return float((y @ y).abs().sum() > 0)

    assert ddpkit.launch(work, 2, timeout=60) == [1.0, 1.0]


def test_auto_start_method_rules():
    assert _choose_start_method("auto", threads=1) == ("fork" if sys.platform.startswith("linux") else "forkserver")
    # forked children + several OpenMP threads can deadlock: a forkserver with torch preloaded instead
    assert _choose_start_method("auto", threads=2) == "forkserver"
    assert ddpkit.start_method(threads=2)[0] == "forkserver" and "threads" in ddpkit.start_method(threads=2)[1]
    assert _choose_start_method("spawn", threads=1) == "spawn"


# --------------------------------------------------------------------------- the contract on every start method

CELL = """
import os, time, torch, torch.distributed as dist
class Box:
    def __init__(self, v): self.v = v
def make_work(offset):
    def work():
        t = torch.tensor([float(dist.get_rank() + offset)])
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} says {t.item():g}; RANK={os.environ['RANK']} EXTRA={os.environ.get('EXTRA')}")
        return Box(t.item()), os.environ.get("HOME_GONE", "removed")
    return work
def broken():
    if dist.get_rank() == 1:
        raise KeyError("rank one lost its key")
    time.sleep(60)
def stuck():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    else:
        time.sleep(60)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_the_launch_contract_holds_on_every_start_method(method, capfd, monkeypatch):
    import linecache

    filename = f"/tmp/ipykernel_0/contract-{method}.py"  # how IPython names a cell: not on disk
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    monkeypatch.setenv("HOME_GONE", "still here")
    try:
        nb = {"__name__": "__notebook_cell__"}
        exec(compile(CELL, filename, "exec"), nb)
        # results, a closure and a notebook class travel; environment (set, overridden, removed) arrives
        out = ddpkit.launch(nb["make_work"](10), 2, start_method=method, env={"EXTRA": "yes", "HOME_GONE": None})
        assert [(box.v, gone) for box, gone in out] == [(21.0, "removed"), (21.0, "removed")]
        assert type(out[0][0]) is nb["Box"]
        printed = capfd.readouterr().out
        assert printed == "[rank0]: rank 0 says 21; RANK=0 EXTRA=yes\n[rank1]: rank 1 says 21; RANK=1 EXTRA=yes\n"
        # the root cause, with the cell's own source line
        with pytest.raises(ddpkit.RankFailedError) as info:
            ddpkit.launch(nb["broken"], 2, start_method=method, timeout=60)
        assert info.value.root_cause.rank == 1
        assert info.value.root_cause.summary == "KeyError: 'rank one lost its key'"
        assert f'File "{filename}", line 14, in broken' in info.value.root_cause.traceback
        assert 'raise KeyError("rank one lost its key")' in info.value.root_cause.traceback
        # a hang ends at the timeout with every rank's stack
        with pytest.raises(ddpkit.LaunchTimeoutError) as hang:
            ddpkit.launch(nb["stuck"], 2, start_method=method, timeout=3)
        assert hang.value.ranks == [0, 1] and all('File "' in hang.value.stacks[r] for r in (0, 1))
        if method != "spawn":  # a spawned rank may still be importing torch after 3 s on a busy machine
            assert "in stuck" in hang.value.stacks[0] and "all_reduce" in hang.value.stacks[0]
    finally:
        del linecache.cache[filename]


def test_the_forkserver_is_started_once_and_reused():
    import multiprocessing.forkserver as fs

    def pid():
        return os.getppid()  # a forkserver's rank is the server's child

    first = ddpkit.launch(pid, 2, start_method="forkserver", init_process_group=False)
    second = ddpkit.launch(pid, 2, env={"OMP_NUM_THREADS": "2"}, init_process_group=False)  # auto -> forkserver
    assert first[0] == first[1] == second[0] == second[1] != os.getpid()
    assert fs._forkserver._forkserver_pid == first[0]


def test_thirty_forkserver_launches_leave_nothing_behind():
    ddpkit.launch(lambda: 0, 2, start_method="forkserver")  # the server itself is a singleton, kept by design
    before = snapshot()
    for _ in range(30):
        assert ddpkit.launch(lambda: dist.get_rank(), 2, start_method="forkserver") == [0, 1]
    assert snapshot() == before


# --------------------------------------------------------------------------- output


def test_output_is_prefixed_and_replayed_in_rank_order_python_and_c(capfd):
    def talk():
        import ctypes

        rank = dist.get_rank()
        time.sleep(0.05 * (3 - rank))  # rank 3 speaks first, rank 0 last
        print(f"python stdout {rank}")
        os.write(1, f"raw fd write {rank}\n".encode())
        ctypes.CDLL(None).printf(b"C printf %d\n", rank)  # block-buffered by C; the launcher flushes it
        print(f"python stderr {rank}", file=sys.stderr)
        sys.stderr.write("no newline at the end")

    ddpkit.launch(talk, 4)
    out, err = capfd.readouterr()
    assert out == "".join(
        f"[rank{r}]: python stdout {r}\n[rank{r}]: raw fd write {r}\n[rank{r}]: C printf {r}\n" for r in range(4)
    )
    assert err == "".join(f"[rank{r}]: python stderr {r}\n[rank{r}]: no newline at the end\n" for r in range(4))


def test_rank0_output_is_live_while_the_others_wait_for_the_end():
    seen: list[tuple[float, str]] = []

    class Recorder:
        def write(self, text):
            seen.append((time.monotonic(), text))

        def flush(self):
            pass

    def work():
        print(f"started {dist.get_rank()}")
        time.sleep(3)

    saved = sys.stdout
    sys.stdout = Recorder()
    try:
        ddpkit.launch(work, 2)
        returned = time.monotonic()
    finally:
        sys.stdout = saved
    times = {text.strip(): t for t, text in seen}
    assert returned - times["[rank0]: started 0"] > 2.0  # shown while the launch was still running
    assert returned - times["[rank1]: started 1"] < 1.0  # held back, replayed at the end


# --------------------------------------------------------------------------- failures


def test_a_raising_rank_is_the_root_cause_and_peers_are_stopped_fast():
    def work():
        if dist.get_rank() == 2:
            time.sleep(0.2)
            raise ValueError("bad shard on rank 2")
        t = torch.ones(1)
        dist.all_reduce(t)  # blocks until rank 2 dies, then fails with a connection error
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(work, 4, timeout=30)
    elapsed = time.monotonic() - start
    err = info.value
    assert err.root_cause.rank == 2
    assert err.root_cause.exitcode == 1
    assert err.root_cause.summary == "ValueError: bad shard on rank 2"
    assert 'raise ValueError("bad shard on rank 2")' in err.root_cause.traceback
    assert "_child.py" not in err.root_cause.traceback  # the launcher's own frame is trimmed
    message = str(err)
    assert message.startswith("rank 2 of 4 failed: ValueError: bad shard on rank 2")
    assert message.index("Root Cause") < message.index("Traceback")
    assert {f.rank for f in err.failures} | set(err.stopped) == {0, 1, 2, 3}
    assert elapsed < 15, f"peers were not stopped promptly ({elapsed:.1f} s)"


def test_a_rank_that_exits_without_exception_beats_the_peers_it_broke():
    def work():
        if dist.get_rank() == 1:
            os._exit(3)
        t = torch.ones(1)
        dist.all_reduce(t)

    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(work, 3)
    root = info.value.root_cause
    assert (root.rank, root.exitcode, root.signal_name) == (1, 3, None)
    assert "without raising" in root.summary
    for other in info.value.failures[1:]:
        assert "RuntimeError" in other.summary  # a peer's "connection closed/reset"


def test_a_segfault_is_reported_with_its_signal_and_python_stack():
    def crash_here():
        import ctypes

        ctypes.string_at(0)  # SIGSEGV

    def work():
        if dist.get_rank() == 1:
            crash_here()
        t = torch.ones(1)
        dist.all_reduce(t)

    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(work, 2)
    root = info.value.root_cause
    assert root.rank == 1 and root.exitcode == -11 and root.signal_name == "SIGSEGV"
    assert "in crash_here" in root.traceback and "Segmentation fault" in root.traceback
    assert "SIGSEGV" in str(info.value)


def test_killed_by_signal_while_peers_wait():
    def work():
        import signal

        if dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(work, 3, timeout=30)
    assert info.value.root_cause.signal_name == "SIGKILL"
    assert info.value.stopped == [1, 2]  # sleeping peers were stopped, not reported as failures


def test_sys_exit_zero_is_a_normal_end_and_nonzero_a_failure():
    assert ddpkit.launch(lambda: sys.exit(0), 2, init_process_group=False) == [None, None]
    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(lambda: sys.exit(4), 1, init_process_group=False)
    assert info.value.root_cause.exitcode == 4


def test_an_unpicklable_return_value_is_a_clear_rank_error():
    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(threading.Lock, 1, init_process_group=False)
    assert "cannot carry back" in info.value.root_cause.summary


def test_a_hang_ends_at_the_timeout_with_every_rank_stack():
    def stuck_in_collective():
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 1 never joins

    def work():
        if dist.get_rank() == 0:
            stuck_in_collective()
        else:
            time.sleep(120)

    start = time.monotonic()
    with pytest.raises(ddpkit.LaunchTimeoutError) as info:
        ddpkit.launch(work, 2, timeout=3)
    elapsed = time.monotonic() - start
    err = info.value
    assert err.ranks == [0, 1]
    assert "in stuck_in_collective" in err.stacks[0] and "all_reduce" in err.stacks[0]
    assert "in work" in err.stacks[1] and "stuck_in_collective" not in err.stacks[1]
    assert "timeout=3 s" in str(err) and "rank 1 was here" in str(err)
    assert elapsed < 20


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(world_size=0), "world_size must be a whole number >= 1"),
        (dict(world_size=2.0), "world_size must be a whole number"),
        (dict(world_size=True), "world_size must be a whole number"),
        (dict(world_size=6, nnodes=4), "not divisible by nnodes=4"),
        (dict(world_size=2, nnodes=0), "nnodes must be"),
        (dict(backend="glooo"), "unknown backend 'glooo'. Use 'gloo'"),
        (dict(backend="nccl"), "Use backend='gloo' to run on the CPU"),
        (dict(backend="mpi"), "mpirun"),
        (dict(start_method="threads"), "use one of auto, fork, spawn, forkserver"),
        (dict(timeout=0), "timeout must be a positive number"),
        (dict(env={"OMP_NUM_THREADS": "many"}), "OMP_NUM_THREADS"),
    ],
)
def test_bad_input_fails_fast_with_advice(kwargs, words):
    if kwargs.get("backend") == "nccl" and ddpkit.gpu_count() >= 4:
        pytest.skip("this machine has enough GPUs for nccl")
    start = time.monotonic()
    with pytest.raises((ValueError, TypeError)) as info:
        ddpkit.launch(lambda: None, **{"world_size": 4, **kwargs})
    assert words in str(info.value)
    assert time.monotonic() - start < 5


def test_a_function_cloudpickle_cannot_carry_is_refused_before_starting():
    lock = threading.Lock()
    with pytest.raises(TypeError) as info:
        ddpkit.launch(lambda: lock.locked(), 2)
    assert "cannot send" in str(info.value) and "inside the function" in str(info.value)
    with pytest.raises(TypeError, match="fn must be callable"):
        ddpkit.launch(42, 2)


# --------------------------------------------------------------------------- hygiene


def test_thirty_launches_leave_nothing_behind():
    # the no_leaks fixture compares processes, descriptors, threads and temp dirs before and after
    for i in range(30):
        assert ddpkit.launch(lambda: dist.get_rank(), 2) == [0, 1]


def test_rendezvous_listens_on_loopback_only():
    import psutil

    def listeners():
        me = psutil.Process(os.getpid())
        return [c.laddr for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]

    def work():
        t = torch.ones(1)
        dist.all_reduce(t)
        return listeners()

    for addrs in ddpkit.launch(work, 3):
        assert addrs, "gloo should be listening for its peers"
        assert all(a.ip in ("127.0.0.1", "::1") for a in addrs), addrs


def test_summary_is_the_first_line_of_a_multi_line_error():
    def work():
        raise RuntimeError("the real problem\nsome advice on a second line")

    with pytest.raises(ddpkit.RankFailedError) as info:
        ddpkit.launch(work, 1, init_process_group=False)
    assert info.value.root_cause.summary == "RuntimeError: the real problem"


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_ranks_are_named_in_ps_not_copies_of_the_kernel(method):
    def name():
        import psutil

        me = psutil.Process()
        return " ".join(me.cmdline()).strip(), me.name()

    names = ddpkit.launch(name, 3, start_method=method, init_process_group=False)
    assert [cmdline for cmdline, _ in names] == [f"ddpkit rank {r}/3" for r in range(3)]
    assert all(short.startswith("ddpkit rank") for _, short in names)  # what `ps -e` and `top` show


def test_a_line_that_names_its_rank_already_is_not_prefixed_twice(capfd):
    # PyTorch's C++ warnings start with "[rank0]:" themselves (here DDP's reducer, which finds no
    # unused parameter); the relay adds its prefix only to lines that do not name their own rank.
    def warn_from_cpp():
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(torch.nn.Linear(2, 2), find_unused_parameters=True)
        model(torch.ones(1, 2)).sum().backward()
        os.write(2, f"[rank{1 - dist.get_rank()}]: the other rank's name, written by rank {dist.get_rank()}\n".encode())

    ddpkit.launch(warn_from_cpp, 2)
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "find_unused_parameters=True was specified" in line]
    assert [line[:9] for line in warnings] == ["[rank0]:[", "[rank1]:["], err
    assert "[rank0]: [rank1]: the other rank's name, written by rank 0" in err.splitlines()
    assert "[rank1]: [rank0]: the other rank's name, written by rank 1" in err.splitlines()
