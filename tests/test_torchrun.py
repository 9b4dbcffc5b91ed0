"""ddpkit.torchrun runs the real torchrun: success, failure, timeout and interrupt leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
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
    """Agents and workers of this test run: their command line names a script in our private TMPDIR."""
    mine = os.path.join(tempfile.gettempdir(), "ddpkit-torchrun-")
    return [p for p in psutil.process_iter(["cmdline"]) if mine in " ".join(p.info["cmdline"] or [])]


def test_standalone_run_relays_worker_lines_in_rank_order(capfd):
    assert ddpkit.torchrun(SCRIPT, "--standalone", "--nproc_per_node=2") == 0
    out, err = capfd.readouterr()
    assert out.startswith("[rank0]: rank 0 local 0 node 0 of 2 via torchrun: sum 1\n[rank1]: rank 1 local 1 node 0 of 2 via torchrun: sum 1\n")
    assert "[agent0]: Setting OMP_NUM_THREADS" in out and "OMP_NUM_THREADS" not in err  # a notice, not an error
    assert not _torchrun_processes()


def test_two_agents_as_two_machines(capfd):
    code = ddpkit.torchrun(
        SCRIPT, "--nnodes=2", "--nproc_per_node=2", "--node_rank={node_rank}",
        "--master_addr=127.0.0.1", "--master_port={port}", nodes=2,
    )
    assert code == 0
    out, _ = capfd.readouterr()
    assert [line for line in out.splitlines() if line.startswith("[rank")] == [
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
    # A process that starts with SIGINT ignored (as under `cmd &` in a non-interactive shell, how CI
    # scripts often start the suite) gets no KeyboardInterrupt from Python: ask for it explicitly.
    driver.write_text(textwrap.dedent("""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import ddpkit
        try:
            ddpkit.torchrun("import time\\nprint('sleeping', flush=True)\\ntime.sleep(120)\\n",
                            "--standalone", "--nproc_per_node=2", timeout=100)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    descendants: list[psutil.Process] = []
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
        for p in descendants:  # a failed test must not leave the agent and its workers to the next tests
            with contextlib.suppress(psutil.Error):
                p.kill()


FAILS_EVERY_TIME = """
import os, time
print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} of {1 + int(os.environ['TORCHELASTIC_MAX_RESTARTS'])}")
if os.environ["RANK"] == "1":
    raise ValueError("worker one is broken")
time.sleep(60)  # rank 0 waits until the agent stops it
"""


def test_clean_agent_log_gives_the_same_root_cause_report_every_time(capfd):
    assert ddpkit.torchrun(FAILS_EVERY_TIME, "--standalone", "--nproc_per_node=2", "--max-restarts=1",
                           agent_log="clean") == 1
    out, err = capfd.readouterr()
    ranks_out = [line for line in out.splitlines() if line.startswith("[rank")]
    assert ranks_out == ["[rank0]: attempt 0 of 2", "[rank0]: attempt 1 of 2", "[rank1]: attempt 0 of 2", "[rank1]: attempt 1 of 2"]
    # torchrun's OMP_NUM_THREADS notice is information: ordinary output, not an error on a red background
    notice = [line for line in out.splitlines() if line.startswith("[agent0]")]
    assert any("Setting OMP_NUM_THREADS" in line for line in notice), out
    assert all(line.startswith("[agent0]: *****") or "OMP_NUM_THREADS" in line or line == "[agent0]: " for line in notice)
    assert "OMP_NUM_THREADS" not in err
    agent = [line for line in err.splitlines() if line.startswith("[agent0]: ")]
    assert "[agent0]: E failed (exitcode: 1) local_rank: 1 (pid: <pid>) of binary: <python>" in agent
    assert "[agent0]: train.py FAILED" in agent  # the private temp dir is not shown
    root = agent.index("[agent0]: Root Cause (first observed failure):")
    assert agent[root + 2:root + 5] == [
        "[agent0]:   time      : <time>", "[agent0]:   host      : <host>", "[agent0]:   rank      : 1 (local_rank: 1)",
    ]
    assert not any(line.startswith("[agent0]:   File ") for line in agent)  # the agent's own traceback is gone
    assert err.count('[rank1]:   File "train.py", line 5, in <module>') == 2
    assert not _torchrun_processes()


def test_agent_log_can_be_hidden_or_collected_and_code_can_be_a_path(tmp_path, capfd):
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    lines: list[str] = []
    assert ddpkit.torchrun(script, "--standalone", "--nproc_per_node=2", agent_log=lines) == 0
    out, err = capfd.readouterr()
    assert out == "[rank0]: hello from 0\n[rank1]: hello from 1\n" and err == ""
    assert any("OMP_NUM_THREADS" in line for line in lines)
    with pytest.raises(ValueError, match="agent_log"):
        ddpkit.torchrun("pass", agent_log="loud")
    with pytest.raises(ValueError, match="join_when"):
        ddpkit.torchrun("pass", join_when="ready")


def test_magic_line_parsing_and_registration_outside_ipython():
    from ddpkit._torchrun import _parse_magic_line

    assert _parse_magic_line("--nodes=2 --nnodes=2 --node_rank={node_rank} --join-when 'world size 2'") == (
        ["--nnodes=2", "--node_rank={node_rank}"], {"nodes": 2, "join_when": "world size 2"}, [],
    )
    with pytest.raises(ValueError, match="needs a value"):
        _parse_magic_line("--standalone --timeout")
    from ddpkit._torchrun import _join_continued_lines

    assert _join_continued_lines("--standalone \\", " --nproc_per_node=2 \\\n  --max-restarts=1\nimport os\n") == (
        "--standalone --nproc_per_node=2 --max-restarts=1", "import os\n",
    )
    with pytest.raises(ValueError, match="no next line"):
        _join_continued_lines("--standalone \\", "")
    assert ddpkit.register_magics() is False


def test_cell_magic_in_an_ipython_shell(tmp_path):
    driver = tmp_path / "shell.py"
    driver.write_text(textwrap.dedent('''
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "ddpkit")
        port = "not a placeholder"  # {port} in a %%torchrun line is ddpkit's, not a Python expression
        result = shell.run_cell(
            # a line ending in a backslash continues on the next one, as in a shell
            "%%torchrun --standalone --nproc_per_node=2 \\\\\\n"
            "    --agent-log=hide --master_port={port} -- a b\\n"
            "import os, sys\\n"
            "print(os.environ['RANK'], sys.argv[1:])\\n"
        )
        print("status", result.result)
    '''))
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=120)
    # the shell displays the cell's value, the exit status, as Out[0]
    assert done.stdout.splitlines() == ["[rank0]: 0 ['a', 'b']", "[rank1]: 1 ['a', 'b']", "Out[0]: 0", "status 0"], done


SCALE_UP = """
import time, torch, torch.distributed as dist
import ddpkit
env = ddpkit.setup_distributed()
print(f"world size {env.world_size}, restart count {env.restart_count}")
if env.world_size < 4:
    time.sleep(120)  # the agent stops us when a second machine joins
t = torch.ones(1)
dist.all_reduce(t)
print(f"sum {t.item():g}")
dist.destroy_process_group()
"""


def test_a_late_machine_joins_and_the_group_grows_without_using_a_restart(capfd):
    code = ddpkit.torchrun(
        SCALE_UP, "--nnodes=1:2", "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-conf=last_call_timeout=1", nodes=2, join_when="world size 2", agent_log="hide", timeout=100,
    )
    assert code == 0
    out, _ = capfd.readouterr()
    assert out.splitlines() == [
        "[rank0]: world size 2, restart count 0", "[rank0]: world size 4, restart count 0", "[rank0]: sum 4",
        "[rank1]: world size 2, restart count 0", "[rank1]: world size 4, restart count 0", "[rank1]: sum 4",
        "[rank2]: world size 4, restart count 0", "[rank2]: sum 4",
        "[rank3]: world size 4, restart count 0", "[rank3]: sum 4",
    ]
    assert not _torchrun_processes()


def test_a_line_written_in_pieces_comes_back_whole(capfd):
    """torchrun's --tee relays what a worker's log file holds so far, so half a line is one piece and its rest
    another (and another rank's piece may come between): ddpkit joins each rank's pieces back into its lines."""
    code = ("import os, sys, time\nr = os.environ['RANK']\n"
            "for i in range(3):\n"
            "    sys.stdout.write(f'rank {r} half '); sys.stdout.flush(); time.sleep(0.4)\n"
            "    print(f'and rest {i}')\n")
    assert ddpkit.torchrun(code, "--standalone", "--nproc_per_node=2", agent_log="hide") == 0
    out, _ = capfd.readouterr()
    assert out.splitlines() == [f"[rank{r}]: rank {r} half and rest {i}" for r in range(2) for i in range(3)], out
