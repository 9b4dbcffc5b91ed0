"""``python -m ddpkit doctor`` and ``python -m ddpkit lab``, run for real on this machine."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddpkit import _doctor
from ddpkit._doctor import check_cores, check_ports, check_ptrace, check_python, check_torch

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["python", "torch", "start_methods", "gloo", "loopback", "ports", "launch", "cores", "jupyterlab", "widgets",
         "ptrace"]
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


def ddpkit_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddpkit", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# --------------------------------------------------------------------------- the real doctor


def test_doctor_json_runs_every_check_and_a_real_two_rank_launch():
    done = ddpkit_command("doctor", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert list(checks) == NAMES
    for name in ("python", "start_methods", "gloo", "loopback", "launch"):
        assert checks[name]["status"] == "OK", checks[name]
    import torch

    import ddpkit
    from ddpkit._env import RECORDED_WITH

    recorded = torch.__version__.split("+")[0] == RECORDED_WITH["torch"] and ddpkit.torch_build().kind == "CPU"
    assert checks["torch"]["status"] == ("OK" if recorded else "WARN"), checks["torch"]  # warns, never fails
    assert checks["torch"]["found"].startswith(f"torch {torch.__version__}, ")
    assert re.search(r", (CPU build|CUDA build \(runtime [\d.]+\), \d+ GPUs? seen)", checks["torch"]["found"])
    for c in checks.values():
        assert c["status"] in ("OK", "WARN"), c  # ports, cores, jupyterlab, widgets, ptrace depend on the machine
        assert bool(c["fix"]) == (c["status"] != "OK"), c
    assert re.fullmatch(r"2 ranks, all_reduce -> \[3\.0, 3\.0\] in \d+\.\d s .*", checks["launch"]["found"])
    assert "ddpkit.launch(start_method='auto') picks " in checks["start_methods"]["found"]
    assert ("running as root" if ROOT_USER else "not running as root") in checks["ptrace"]["found"]


def test_a_failing_check_fails_the_doctor_with_its_fix(capsys):
    too_old = functools.partial(check_python, (3, 9, 18))
    assert _doctor.main([], checks=[too_old, check_cores]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^python +FAIL +3\.9\.18; ddpkit needs 3\.10 or newer", out, flags=re.M), out
    assert "FAIL python: Install Python 3.10 or newer" in out
    assert _doctor.main(["--json"], checks=[check_cores]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "cores"


def test_a_check_that_crashes_becomes_a_fail_instead_of_stopping_the_doctor():
    def check_broken():
        raise RuntimeError("boom")

    (result,) = _doctor.run_checks([check_broken])
    assert (result.name, result.status, result.found) == ("broken", "FAIL", "RuntimeError: boom")
    assert result.fix


# --------------------------------------------------------------------------- single checks, given what to judge


def test_python_and_torch_versions():
    assert check_python((3, 10, 0)).status == "OK"
    assert check_python((3, 9, 18)).status == "FAIL"
    assert check_torch("2.13.0+cpu").status == "OK"
    for other in ("2.11.0", "2.14.1+cu130", "2.15.0"):  # the tested range: runs, words some messages differently
        warned = check_torch(other, build=f"torch {other}, CUDA build (runtime 13.0), 0 GPUs seen")
        assert warned.status == "WARN" and "recorded with 2.13.0, CPU build" in warned.found
        assert "torch==2.13.0" in warned.fix
        assert warned.found.startswith(f"torch {other}, CUDA build (runtime 13.0), 0 GPUs seen; ")
    cuda_wheel = check_torch("2.13.0+cu130")  # the recorded release, but PyPI's CUDA wheel
    assert cuda_wheel.status == "WARN" and "CPU wheel" in cuda_wheel.fix, cuda_wheel
    untested = check_torch("2.16.0")
    assert untested.status == "WARN" and "newer than the releases ddpkit was tested with (2.11 to 2.15)" in untested.found
    older = check_torch("2.10.1+cu121")
    assert older.status == "FAIL" and "pip install torch==2.13.0" in older.fix


def test_a_port_someone_listens_on_is_reported_with_torchruns_fixes():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken = check_ports(port)
    assert taken.status == "WARN" and f"port {port} is in use" in taken.found
    assert "--master_port" in taken.fix and "--standalone" in taken.fix


def test_cores():
    assert check_cores(cpu_count=8, usable=4).status == "OK"
    one = check_cores(cpu_count=8, usable=1)
    assert one.status == "WARN" and "slower" in one.fix and "1 usable" in one.found


def test_ptrace_scope(tmp_path):
    assert "not applicable" in check_ptrace(str(tmp_path / "missing")).found
    scope = tmp_path / "ptrace_scope"
    scope.write_text("0\n")
    assert check_ptrace(str(scope)).status == "OK"
    scope.write_text("1\n")
    restricted = check_ptrace(str(scope))
    if _doctor._can_ptrace_any():  # root with CAP_SYS_PTRACE may attach anyway
        assert restricted.status == "OK" and "CAP_SYS_PTRACE" in restricted.found
    else:
        assert restricted.status == "WARN" and "sudo sysctl kernel.yama.ptrace_scope=0" in restricted.fix


# --------------------------------------------------------------------------- lab


def test_lab_dry_run_prints_the_note_and_the_command_it_would_exec(capsys):
    assert _doctor.lab_main(["--dry-run", "--port=8899", "--no-browser"], checks=[check_cores]) == 0
    out = capsys.readouterr().out
    assert _doctor.SERVER_NOTE.split(".")[0] in out.replace("\n", " ")
    command = shlex.split(re.search(r"^\$ (.*)$", out, flags=re.M).group(1))
    expected = [sys.executable, "-m", "jupyterlab", str(ROOT / "notebooks"), "--port=8899", "--no-browser"]
    assert command == expected + _doctor.quiet_server_options() + (["--allow-root"] if ROOT_USER else [])


def test_lab_stops_with_the_fixes_when_a_check_fails(capsys):
    too_old = functools.partial(check_python, (3, 9, 18))
    assert _doctor.lab_main(["--dry-run"], checks=[too_old]) == 1
    out = capsys.readouterr().out
    assert "FAIL python: Install Python 3.10 or newer" in out and "$ " not in out


def test_lab_explains_a_missing_notebooks_folder(tmp_path, capsys):
    assert _doctor.lab_main(["--dry-run", "--notebooks", str(tmp_path / "nope")], checks=[]) == 1
    assert "pass --notebooks DIR" in capsys.readouterr().err


def test_the_command_line_dispatches_and_the_lab_command_exists():
    usage = ddpkit_command(timeout=60)
    assert usage.returncode == 2 and "doctor" in usage.stderr and "lab" in usage.stderr
    help_ = ddpkit_command("lab", "--help", timeout=60)
    assert help_.returncode == 0 and "--dry-run" in help_.stdout and "jupyter lab" in help_.stdout
    pytest.importorskip("jupyterlab")
    command = _doctor.lab_command("notebooks")
    version = subprocess.run([*command[:3], "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and re.fullmatch(r"\d+\.\d+\.\d+\S*\n", version.stdout), version
