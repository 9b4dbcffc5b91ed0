"""The PyTorch a learner has: fork safety by PyTorch's own rule, on the CPU wheel and on a CUDA wheel.

Each case runs in a fresh interpreter: ``torch.cuda.is_available()`` marks the process that calls it for
good (every later fork is a bad fork on a CUDA build), so it must not run in the test process itself.
On the CPU wheel nothing is ever poisoned and ``auto`` forks; on a CUDA wheel (with or without a GPU)
the same script must see ``auto`` refuse to fork and the ranks able to use CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import ddpkit

pytestmark = pytest.mark.usefixtures("no_leaks")

CUDA_BUILD = torch.backends.cuda.is_built()


def run_python(code: str, timeout: float = 120) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_is_available_in_the_parent_then_launch_gives_ranks_that_are_not_in_a_bad_fork():
    found = run_python("""
        import json, time, torch, ddpkit
        before = ddpkit.start_method()[0]
        torch.cuda.is_available()  # what chapter 02 used to do in its first cell
        method, why = ddpkit.start_method()
        def child_state():
            return torch.cuda._is_in_bad_fork()
        bad = ddpkit.launch(child_state, 2)
        try:
            start = time.monotonic()
            ddpkit.launch(child_state, 2, start_method="fork")
            forced = "launched"
        except RuntimeError as exc:
            forced = f"{time.monotonic() - start:.2f} s: {exc}"
        print(json.dumps({"before": before, "method": method, "why": why, "bad": bad, "forced": forced}))
    """)
    assert found["before"] == "fork", found  # nothing touched CUDA yet: fork is safe on any build
    assert found["bad"] == [False, False], found  # whatever auto chose, the ranks can use CUDA
    if CUDA_BUILD:
        assert found["method"] == "forkserver" and "CUDA was touched in this process" in found["why"], found
        seconds, message = found["forced"].split(" s: ", 1)
        assert float(seconds) < 2, found  # refused at once, in the launcher, not in a rank
        assert "start_method='fork' is unsafe here" in message and "start_method='auto'" in message, found
    else:  # the CPU wheel has no CUDA to poison
        assert found["method"] == "fork" and found["forced"] == "launched", found


def test_ddpkits_own_gpu_checks_leave_the_kernel_forkable():
    found = run_python("""
        import json, torch, ddpkit
        from ddpkit._build import fork_poisoned
        seen = [ddpkit.gpu_count(), str(ddpkit.torch_build()), str(ddpkit.dist_env({}).device),
                ddpkit.dist_env({}).backend]
        print(json.dumps({"seen": seen, "poisoned": fork_poisoned(), "method": ddpkit.start_method()[0]}))
    """)
    gpus, build, device, backend = found["seen"]
    assert build == str(ddpkit.torch_build())
    if gpus == 0:
        assert (device, backend) == ("cpu", "gloo"), found
    assert not found["poisoned"] and found["method"] == "fork", found


def test_the_probe_sees_a_poisoned_process_only_on_a_cuda_build():
    found = run_python("""
        import json, torch
        from ddpkit._build import fork_poisoned
        before = fork_poisoned()
        torch.cuda.device_count()  # without an NVIDIA driver this asks the CUDA runtime
        print(json.dumps({"before": before, "after": fork_poisoned(), "nvml": torch.cuda._device_count_nvml()}))
    """)
    assert found["before"] is False
    if not CUDA_BUILD:
        assert found["after"] is False
    elif found["nvml"] < 0:  # no NVML: device_count() fell back to the runtime, which poisons
        assert found["after"] is True, found


def test_torch_build_names_the_wheel():
    build = ddpkit.torch_build()
    assert build.version == torch.__version__
    assert build.kind == ("CUDA" if CUDA_BUILD and torch.version.hip is None else "ROCm" if torch.version.hip
                          else "CPU")
    assert (build.runtime is None) == (build.kind == "CPU")
    assert str(build).startswith(f"torch {torch.__version__}, {build.kind} build")


def test_the_probe_forks_a_real_child_and_believes_what_it_reports(monkeypatch):
    # On the CPU wheel nothing can be poisoned, so plant PyTorch's answer: a child that says "bad fork".
    import os

    from ddpkit import _build, _launch

    parent = os.getpid()
    monkeypatch.setattr(_build, "_cuda_built", lambda: True)
    monkeypatch.setattr(_build, "_POISONED", [])
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: os.getpid() != parent)
    assert _build.fork_poisoned() is True  # only the forked child says so: the answer came from it
    assert _build._POISONED == [True]
    method, why = ddpkit.start_method()
    assert method == "forkserver" and "CUDA was touched" in why
    with pytest.raises(RuntimeError, match="start_method='fork' is unsafe here"):
        _launch._choose_start_method("fork", 1)
    monkeypatch.setattr(_build, "_POISONED", [])
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    assert _build.fork_poisoned() is False and ddpkit.start_method()[0] == "fork"
