"""Experiments and progress bars in a real kernel, driven the way JupyterLab 4.6 drives them.

JupyterLab sends widget messages with a ``subshell_id``; ipykernel 7 then runs
the button's callback on a subshell thread, not the main one. A picture drawn
there through pyplot and ``with output:`` capture raced with the browser and
often landed in the Log Console instead of the widget. These tests click
through a subshell exactly like that and check where every output went.
"""

from __future__ import annotations

import base64
import struct
import time


from test_kernel import interrupt_once_working, kernel, run_cell  # noqa: F401  (kernel: a fixture, one per module)

import ddpkit


def _create_subshell(kc) -> str:
    msg = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(msg)
    reply = kc.get_control_msg(timeout=10)
    assert reply["msg_type"] == "create_subshell_reply", reply
    return reply["content"]["subshell_id"]


def _click(kc, comm_id: str, subshell_id: str) -> str:
    """Press a button the way JupyterLab does: a comm message on a subshell."""
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})
    msg["header"]["subshell_id"] = subshell_id
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def _png_size(b64: str) -> tuple[int, int]:
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


EXPERIMENT = """
import threading
import ipywidgets as widgets
from matplotlib.figure import Figure
import torch, torch.distributed as dist
import ddpkit

def gather_ranks(world_size):
    def work():
        for _ in ddpkit.progress(range(3), desc="steps"):
            pass
        print("hello from", dist.get_rank())
        return dist.get_rank()
    ranks = ddpkit.launch(work, world_size=world_size)
    fig = Figure(figsize=(4, 3))
    fig.add_subplot().bar(range(world_size), [r + 1 for r in ranks])
    threads.append(threading.current_thread() is threading.main_thread())
    return [f"ranks {ranks}", fig]

threads = []
exp = ddpkit.experiment(gather_ranks, {"world_size": widgets.IntSlider(value=2, min=1, max=3)})
display(exp)
print(exp.button.model_id, exp.output.model_id)
"""


def test_clicks_on_a_subshell_draw_every_picture_inside_the_widget(kernel):
    _, kc = kernel
    out = run_cell(kc, EXPERIMENT)
    assert out["error"] is None, out
    button_id, output_id = out["stdout"].split()
    subshell = _create_subshell(kc)
    for click in range(4):
        run_cell(kc, f"exp.controls['world_size'].value = {1 + click % 3}")
        msg_id = _click(kc, button_id, subshell)
        leaked, states, disabled = [], [], []
        deadline = time.monotonic() + 60
        while True:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind in ("stream", "display_data", "error"):
                leaked.append(msg)  # would show in JupyterLab's Log Console, not in the widget
            elif kind == "comm_msg":
                state = content["data"].get("state", {})
                if content["comm_id"] == output_id and "outputs" in state:
                    states.append(state["outputs"])
                if content["comm_id"] == button_id and "disabled" in state:
                    disabled.append(state["disabled"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        assert not leaked, f"click {click}: output escaped the widget: {leaked[:2]}"
        assert disabled[:1] == [True] and disabled[-1] is False, disabled  # disabled while it ran
        final = states[-1]
        world_size = 1 + click % 3
        text = "".join(o.get("text", "") for o in final if o["output_type"] == "stream")
        assert "[rank0]: hello from 0" in text and f"ranks {list(range(world_size))}" in text, text
        pictures = [o for o in final if "image/png" in o.get("data", {})]
        assert len(pictures) == 1, final
        assert _png_size(pictures[0]["data"]["image/png"]) > (100, 100)
    # the callbacks ran off the main thread, as in JupyterLab (ipykernel may route the very first
    # message of a comm created on the main shell back there; the later ones run on the subshell)
    out = run_cell(kc, "print(threads)")
    assert out["stdout"].strip().endswith("False, False]"), out


def test_a_failing_run_shows_its_error_inside_the_widget_and_frees_the_button(kernel):
    _, kc = kernel
    cell = """
def broken(n):
    return ddpkit.launch(lambda: 1 / 0, world_size=n)
bad = ddpkit.experiment(broken, {"n": widgets.IntSlider(value=2, min=1, max=2)})
bad.click()
errors = "".join(o.get("text", "") for o in bad.output.outputs if o.get("name") == "stderr")
print("ZeroDivisionError" in errors, "root cause" in errors.lower(), bad.button.disabled, "failed" in bad.status.value)
"""
    out = run_cell(kc, cell)
    assert out["error"] is None, out
    assert out["stdout"].strip() == "True True False True", out


def test_progress_bars_are_a_widget_that_nbval_does_not_compare(kernel):
    _, kc = kernel
    cell = """
def steps():
    for _ in ddpkit.progress(range(20), desc="train"):
        time.sleep(0.01)
import time
ddpkit.launch(steps, world_size=2)
"""
    msg_id = kc.execute(cell)
    displays, bar_values, error = [], {}, None
    deadline = time.monotonic() + 60
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "display_data":
            displays.append(msg["content"]["data"])
        elif msg["msg_type"] == "comm_msg":
            state = msg["content"]["data"].get("state", {})
            if "value" in state and isinstance(state["value"], int):
                bar_values[msg["content"]["comm_id"]] = state["value"]
        elif msg["msg_type"] == "error":
            error = msg["content"]
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert error is None, error
    assert len(displays) == 1 and set(displays[0]) == {"application/vnd.jupyter.widget-view+json"}, displays
    assert sorted(bar_values.values()) == [20, 20], bar_values  # both ranks' bars reached the end


def test_an_interrupted_launch_says_which_ranks_it_stopped_in_one_line(kernel):
    km, kc = kernel
    cell = """
import time
def work():
    print("working", flush=True)
    time.sleep(120)
ddpkit.launch(work, world_size=3, timeout=100)
"""
    on_output, _ = interrupt_once_working(km)
    error = run_cell(kc, cell, timeout=60, on_output=on_output)["error_content"]
    assert error is not None and error["ename"] == "KeyboardInterrupt", error
    assert error["evalue"] == "ddpkit.launch interrupted: stopped ranks 0, 1, 2 of 3 (still running)", error
    frames = "\n".join(error["traceback"])
    assert "_supervise" not in frames and "connection.py" not in frames, frames  # no frames of the event loop
    assert frames.count("File ") == 1, frames  # the cell, then launch() itself: nothing deeper


def test_a_new_experiment_says_how_to_start_and_a_press_replaces_it():
    import ipywidgets as widgets

    exp = ddpkit.experiment(lambda n: f"n = {n}", {"n": widgets.IntSlider(value=2)})
    assert "Run the cells above first" in exp.status.value and "Press Run" in exp.status.value
    assert exp.click()
    assert exp.status.value.startswith("done in ")


def test_the_running_line_shows_values_at_the_controls_precision():
    """A log slider's value is 10 ** (k * step): its status line shows it as its readout does (0.0316, not
    0.03162277660168379), so the line and the control agree (issue 26)."""
    import ipywidgets as widgets

    seen = []
    lr = widgets.FloatLogSlider(value=10 ** -1.5, min=-3, max=0, step=0.25, readout_format=".3g")
    exp = ddpkit.experiment(lambda lr, n: seen.append(exp.status.value) or "ok",
                            {"lr": lr, "n": widgets.IntSlider(value=2)})
    assert exp.click()
    assert "lr=0.0316, n=2" in seen[0], seen
