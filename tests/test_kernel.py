"""ddpkit.launch inside a real Jupyter kernel: output reaches the cell, interrupt stops every rank, no leaks."""

from __future__ import annotations

import time

import pytest
from jupyter_client.manager import start_new_kernel


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_cell(kc, code: str, timeout: float = 120, on_output=None) -> dict:
    """Execute a cell; return its stdout, stderr and error as the notebook would store them."""
    msg_id = kc.execute(code)
    result = {"stdout": "", "stderr": "", "error": None, "error_content": None}
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            result[content["name"]] += content["text"]
            if on_output:
                on_output(result)
        elif kind == "error":
            result["error"], result["error_content"] = content["ename"], content
        elif kind == "status" and content["execution_state"] == "idle":
            return result


def interrupt_once_working(km):
    """An ``on_output`` for :func:`run_cell` that interrupts the kernel once rank 0 says it is working."""
    state = {"at": None}

    def on_output(result):
        if state["at"] is None and "[rank0]: working" in result["stdout"]:
            km.interrupt_kernel()
            state["at"] = time.monotonic()

    return on_output, state


SETUP = """
import os, threading, time, psutil, torch, torch.distributed as dist
import ddpkit
def kernel_state():
    me = psutil.Process()
    kids = [p for p in me.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    return (len(kids), me.num_fds(), threading.active_count())
"""


def test_rank_output_reaches_the_cell_in_rank_order(kernel):
    _, kc = kernel
    assert run_cell(kc, SETUP)["error"] is None
    cell = """
class Greeter:                      # a class defined in the notebook travels to the ranks
    def __init__(self, word): self.word = word
    def __call__(self):
        print(f"{self.word} from rank {dist.get_rank()}")
        return dist.get_rank()
print(ddpkit.launch(Greeter("hello"), world_size=3))
"""
    out = run_cell(kc, cell)
    assert out["error"] is None, out
    assert out["stdout"] == "[rank0]: hello from rank 0\n[rank1]: hello from rank 1\n[rank2]: hello from rank 2\n[0, 1, 2]\n"


def test_thirty_launches_leave_the_kernel_as_it_was(kernel):
    _, kc = kernel
    run_cell(kc, SETUP)
    cell = """
ddpkit.launch(lambda: None, world_size=2)   # warm-up: imports and lazy kernel threads settle
time.sleep(0.5)
before = kernel_state()
for _ in range(30):
    assert ddpkit.launch(lambda: dist.get_rank(), world_size=2) == [0, 1]
time.sleep(0.5)
after = kernel_state()
print(*before, *after)
"""
    out = run_cell(kc, cell)
    assert out["error"] is None, out
    kids0, fds0, threads0, kids1, fds1, threads1 = map(int, out["stdout"].split())
    assert kids0 == kids1 == 0  # no rank process and no zombie
    assert fds1 <= fds0, f"descriptors grew from {fds0} to {fds1}"
    assert threads1 <= threads0, f"threads grew from {threads0} to {threads1}"


def test_kernel_interrupt_stops_every_rank(kernel):
    km, kc = kernel
    run_cell(kc, SETUP)
    on_output, interrupted = interrupt_once_working(km)
    cell = """
def work():
    print("working", flush=True)
    time.sleep(120)
ddpkit.launch(work, world_size=3, timeout=100)
"""
    out = run_cell(kc, cell, timeout=60, on_output=on_output)
    error, interrupted_at = out["error"], interrupted["at"]
    assert interrupted_at is not None, "rank 0's output never arrived"
    assert error == "KeyboardInterrupt"
    assert time.monotonic() - interrupted_at < 15
    out = run_cell(kc, "print(kernel_state()[0])")
    assert out["stdout"] == "0\n", out  # no rank, and no zombie, is left


def test_the_forkserver_survives_an_interrupt_is_reused_and_ends_with_the_kernel():
    import psutil

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        cell = """
import time, multiprocessing.forkserver as fs, ddpkit
def work():
    print("working", flush=True)
    time.sleep(120)
print(ddpkit.start_method(threads=2)[0])
ddpkit.launch(work, world_size=2, env={"OMP_NUM_THREADS": "2"}, timeout=100)
"""
        on_output, _ = interrupt_once_working(km)
        out = run_cell(kc, cell, on_output=on_output)
        stdout, error = out["stdout"], out["error"]
        assert stdout.startswith("forkserver\n") and error == "KeyboardInterrupt", (stdout, error)
        out = run_cell(kc, "server = fs._forkserver._forkserver_pid\n"
                           "print(server, ddpkit.launch(lambda: __import__('os').getppid(), 2, start_method='forkserver'))")
        assert out["error"] is None, out
        server, parents = out["stdout"].split(" ", 1)
        assert parents.strip() == f"[{server}, {server}]"  # the same server, still running, forked the new ranks
        server = psutil.Process(int(server))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    server.wait(timeout=15)  # the server exits with its kernel: nothing is left behind
