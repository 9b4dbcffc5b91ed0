"""Shared fixtures: every launch test must leave the test process as it found it (helpers: support.py)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from support import snapshot


@pytest.fixture(scope="session", autouse=True)
def _private_tempdir():
    # Launches create and delete temp dirs; give this test run its own TMPDIR so that the
    # leak check sees only ours, not those of another program running on the same machine.
    import multiprocessing.util

    # multiprocessing's own per-process temp dir (the forkserver's socket lives there, removed at exit):
    # create it in the real temp dir before ours takes over, so it is not mistaken for a leftover
    multiprocessing.util.get_temp_dir()
    private = tempfile.mkdtemp(prefix="tests-")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = private
    yield
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]
    # pytest's own tmp_path root, and torch's compile cache (created by `import torch._dynamo`, kept by design)
    leftovers = [n for n in os.listdir(private) if not n.startswith(("pytest-of-", "torchinductor_"))]
    shutil.rmtree(private, ignore_errors=True)
    assert not leftovers, f"the test run left files in its temp dir: {leftovers}"


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker_started(_private_tempdir):
    # The first spawn starts multiprocessing's resource tracker (a process and a pipe that live
    # as long as this process, by design); start it up front so it is not mistaken for a leak.
    from multiprocessing import forkserver, resource_tracker

    from ddpkit._launch import _context

    resource_tracker.ensure_running()
    # likewise ddpkit's forkserver (a process and the pipe that keeps it alive, kept until exit)
    _context("forkserver")
    forkserver.ensure_running()


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a child process, descriptor, thread or ddpkit temp dir behind."""
    before = snapshot()
    yield
    after = snapshot()
    assert after == before, f"leaked resources: before={before} after={after}"
