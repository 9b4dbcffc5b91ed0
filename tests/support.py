"""Helpers for the tests (imported by name; conftest.py is not importable by name when notebooks/ has one too)."""

from __future__ import annotations

import glob
import os
import tempfile
import threading

import psutil


def _is_resource_tracker(proc: psutil.Process) -> bool:
    # multiprocessing's resource tracker and forkserver: one each per process, started by the first
    # spawn/forkserver launch and kept until the process exits, by design (singletons, not leaks)
    try:
        return any("resource_tracker" in part or "forkserver" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def snapshot() -> dict:
    import gc

    gc.collect()  # objects already unreachable (and their descriptors) are not the test's leak
    me = psutil.Process()
    return {
        "children": sorted(p.pid for p in me.children(recursive=True) if not _is_resource_tracker(p)),
        "fds": me.num_fds(),
        "threads": threading.active_count(),
        "tempdirs": sorted(glob.glob(os.path.join(tempfile.gettempdir(), "ddpkit-*"))),
    }


def in_notebook(source: str) -> dict:
    """Run ``source`` the way a notebook cell runs: in a module Python cannot import by name."""
    namespace = {"__name__": "__notebook_cell__"}
    exec(compile(source, "<notebook-cell>", "exec"), namespace)
    return namespace

