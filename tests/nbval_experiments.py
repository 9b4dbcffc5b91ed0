"""A pytest plugin (``-p nbval_experiments`` in pyproject.toml): after a chapter's last cell under nbval,
press every experiment it has, in the same kernel.

A plugin rather than ``notebooks/conftest.py``: two ``conftest.py`` files in folders that are not
packages clash under ``--doctest-modules`` (both are imported as the module ``conftest``).
"""

from __future__ import annotations

import re

import pytest


# --------------------------------------------------------------------------- experiments under nbval
#
# nbval runs each chapter top to bottom in one kernel. Right after its last cell, in the same
# kernel, one more test item presses every experiment's button: with the default values, then
# with each control at each of its far ends (the others at their defaults). A run must end
# "done" (a run that raised shows "failed"), and show something. Chapters teach failures by
# catching them inside ``run`` and returning what happened.

PRESS_EVERY_EXPERIMENT = r'''
import ipywidgets as _w, ddpkit as _d
def _ends(control):
    if isinstance(control, _w.FloatLogSlider):
        return [control.base ** control.min, control.base ** control.max]
    if hasattr(control, "min") and hasattr(control, "max") and not isinstance(control.value, tuple):
        return [control.min, control.max]
    if hasattr(control, "options") and hasattr(control, "index"):
        return ["index", 0, len(control.options) - 1]
    if isinstance(control.value, bool):
        return [not control.value]
    return []
def _set(control, value, by_index=False):
    if by_index:
        control.index = value
    else:
        control.value = value
_presses = []
for _exp in [v for v in list(globals().values()) if isinstance(v, _d.Experiment)]:
    _defaults = {n: (c.index if hasattr(c, "index") and hasattr(c, "options") else c.value, hasattr(c, "index") and hasattr(c, "options")) for n, c in _exp.controls.items()}
    _settings = [None] + [(n, e) for n, c in _exp.controls.items() for e in _ends(c)[(1 if _ends(c)[:1] == ["index"] else 0):]]
    for _setting in _settings:
        for n, (v, by_index) in _defaults.items():
            _set(_exp.controls[n], v, by_index)
        if _setting is not None:
            _set(_exp.controls[_setting[0]], _setting[1], _defaults[_setting[0]][1])
        _exp.click()
        _shown = _exp.output.outputs
        _errors = "".join(o.get("text", "") for o in _shown if o.get("name") == "stderr")
        _label = f"{_exp.run.__name__}({_exp.values()})"
        assert _exp.status.value.startswith("done"), f"{_label}: {_exp.status.value}\n{_errors}"
        assert _shown, f"{_label} showed nothing"
        _presses.append(_label)
    for n, (v, by_index) in _defaults.items():
        _set(_exp.controls[n], v, by_index)
assert _presses, "this chapter has no ddpkit.experiment"
print(len(_presses), "presses:", *_presses, sep="\n")
'''


class ExperimentPresses(pytest.Item):
    """Press every experiment of a chapter in the kernel nbval ran it in (see PRESS_EVERY_EXPERIMENT)."""

    def runtest(self):
        kernel = self.parent.kernel
        msg_id = kernel.execute_cell_input(PRESS_EVERY_EXPERIMENT)
        stdout, error = "", None
        while True:
            msg = kernel.get_message(stream="iopub", timeout=600)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                stdout += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                error = "\n".join(msg["content"]["traceback"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        if error:
            raise AssertionError(f"an experiment failed:\n{error}\n{stdout}")
        print(stdout)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::press every experiment"


def pytest_collection_modifyitems(session, config, items):
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        parent = getattr(item, "parent", None)
        if type(parent).__name__ != "IPyNbFile" or not re.match(r"\d\d_", parent.path.name):
            continue
        if parent.path.parent.name != "notebooks" or parent.path.name.startswith("00_"):
            continue  # chapters only: the start page, solutions and deeper notebooks have no experiments
        if index + 1 < len(items) and getattr(items[index + 1], "parent", None) is parent:
            continue  # not the notebook's last cell
        items.insert(index + 1, ExperimentPresses.from_parent(parent, name="press every experiment"))


# --------------------------------------------------------------------------- a kernel's normal end
#
# nbval kills each notebook's kernel (`shutdown_kernel(now=True)`), so its exit handlers never run:
# a `tempfile.TemporaryDirectory` a chapter keeps until the kernel ends, or the forkserver's socket
# folder, would stay behind. JupyterLab ends a kernel with a shutdown request, which runs them. Do
# the same here, so the suite's leftover check (tests/conftest.py) sees what a learner's machine sees.


def pytest_configure(config):
    from nbval.kernel import RunningKernel

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)  # a shutdown request first; killed only if it does not end
        del self.km

    RunningKernel.stop = stop

    # ------------------------------------------------------------------- another PyTorch's one-line note
    #
    # On a release or build other than the recorded one, a chapter's first cell prints one line from
    # ddpkit.check_recorded_version(). Drop exactly that line from the fresh outputs (and a stream left
    # empty by it), so that the note alone never fails a strict comparison: the chapters' compared
    # outputs are the same on the CPU and the CUDA wheel of the recorded release (another release may
    # word messages differently; CI runs it lax).
    import nbformat
    from nbval.plugin import IPyNbCell

    from ddpkit._env import VERSION_NOTE

    compare = IPyNbCell.compare_outputs

    def compare_without_note(self, test, ref, skip_compare=None):
        kept = []
        for out in test:
            if out.get("output_type") == "stream" and VERSION_NOTE in out.get("text", ""):
                text = "".join(line for line in out["text"].splitlines(keepends=True)
                               if not line.startswith(VERSION_NOTE))
                if not text:
                    continue
                out = nbformat.from_dict({**out, "text": text})
            kept.append(out)
        return compare(self, kept, ref, skip_compare)

    IPyNbCell.compare_outputs = compare_without_note
