"""ddpkit.torchrun runs the real torchrun: success, failure, timeout and interrupt leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import ddpkit

pytestmark = pytest.mark.usefixtures("no_leaks")

SCRIPT = """
import os, torch, torch.distributed as dist
import ddpkit
env = ddpkit.setup_distributed()
t = torch.tensor([float(env.rank)])
dist.all_reduce(t)
print(f"rank {env.rank} local {env.local_rank} node {env.node_rank} of {env.world_size} via {env.launcher}: sum {t.item():g}")
dist.destroy_process_group()
"""


def _torchrun_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "torch.distributed.run" in cmd or "ddpkit-torchrun-" in cmd:
            found.append(p)
    return found


def test_standalone_run_relays_worker_lines_in_rank_order(capfd):
    assert ddpkit.torchrun(SCRIPT, "--standalone", "--nproc_per_node=2") == 0
    out, err = capfd.readouterr()
    assert out == "[rank0]: rank 0 local 0 node 0 of 2 via torchrun: sum 1\n[rank1]: rank 1 local 1 node 0 of 2 via torchrun: sum 1\n"
    assert "[agent0]: Setting OMP_NUM_THREADS" in err
    assert not _torchrun_processes()


def test_two_agents_as_two_machines(capfd):
    code = ddpkit.torchrun(
        SCRIPT, "--nnodes=2", "--nproc_per_node=2", "--node_rank={node_rank}",
        "--master_addr=127.0.0.1", "--master_port={port}", nodes=2,
    )
    assert code == 0
    out, _ = capfd.readouterr()
    assert out.splitlines() == [
        f"[rank{r}]: rank {r} local {r % 2} node {r // 2} of 4 via torchrun: sum 6" for r in range(4)
    ]


def test_a_failing_worker_gives_a_nonzero_status_and_its_traceback(capfd):
    code = "import os\nif os.environ['RANK'] == '1':\n    raise ValueError('worker one is broken')\n"
    assert ddpkit.torchrun(code, "--standalone", "--nproc_per_node=2") == 1
    out, err = capfd.readouterr()
    assert "[rank1]: ValueError: worker one is broken" in err
    assert "Root Cause (first observed failure)" in err
    assert not _torchrun_processes()


def test_timeout_stops_agents_and_workers():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout=4 s"):
        ddpkit.torchrun("import time\ntime.sleep(120)\n", "--standalone", "--nproc_per_node=2", timeout=4)
    assert time.monotonic() - start < 20
    assert not _torchrun_processes()


def test_bad_arguments_fail_fast():
    with pytest.raises(ValueError, match="--node_rank"):
        ddpkit.torchrun("pass", "--nnodes=2", "--nproc_per_node=1", nodes=2)
    with pytest.raises(ValueError, match="nodes must be"):
        ddpkit.torchrun("pass", nodes=0)
    with pytest.raises(ValueError, match="non-empty"):
        ddpkit.torchrun("  ")


def test_interrupt_stops_every_agent_and_worker(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent("""
        import ddpkit
        try:
            ddpkit.torchrun("import time\\nprint('sleeping', flush=True)\\ntime.sleep(120)\\n",
                            "--standalone", "--nproc_per_node=2", timeout=100)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "[rank0]: sleeping"
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert len(descendants) >= 3  # the agent and its two workers
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
        assert "interrupted" in proc.stdout.read()
        gone, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, alive
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
