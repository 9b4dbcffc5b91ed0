"""Experiments: a few controls, a Run button, and a real launch behind them.

Every chapter ends its teaching with an experiment: the learner changes what a
practitioner would vary (the world size, the init method, the crash step) and
presses **Run**; a real job runs and its pictures and tables appear inside the
widget. A plain cell beside it runs the same function with the default values,
so the notebook's saved output (checked by nbval) shows the same thing.

    exp = ddpkit.experiment(explore, {"nnodes": widgets.IntSlider(2, 1, 4)}, button="Launch")
    display(exp)      # the controls
    exp.run_here()    # the plain cell: explore(nnodes=2), shown in the cell

Why not ``with output: plt.show()``? In JupyterLab 4.6 with ipykernel 7, a
button's callback runs on a *subshell thread*. pyplot's global state and the
Output widget's capture (which works by matching message ids in the browser)
race with the widget state the browser echoes back: about half the clicks gave
a blank or half-drawn picture, the full one landing in the Log Console. So an
experiment never captures: ``run`` returns its pictures as
:class:`matplotlib.figure.Figure` objects (built with ``Figure()``, never
pyplot), each is rendered to PNG here and put into the Output widget's
``outputs`` *state*; text the run prints on this thread is routed into the
same state (:func:`ddpkit._output.routed_output`). The button is disabled
while a run is in progress, and the status line says what is happening.
"""

from __future__ import annotations

import base64
import contextlib
import io
import threading
import time
import traceback
from typing import Any, Callable, Mapping

from ._output import routed_output


def figure_png(fig) -> bytes:
    """Render a matplotlib Figure to PNG bytes without touching pyplot (thread-safe).

    >>> from matplotlib.figure import Figure
    >>> fig = Figure(figsize=(2, 1)); _ = fig.add_subplot().plot([0, 1])
    >>> figure_png(fig)[:4]
    b'\\x89PNG'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # a private canvas: no pyplot figure manager, no global state
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight")
    return buffer.getvalue()


def _is_figure(item: Any) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return False
    return isinstance(item, Figure)


def as_output(item: Any) -> dict:
    """The notebook output (an nbformat dict) that shows ``item``: a Figure, a str, or any object.

    >>> as_output("hello")["text"]
    'hello\\n'
    >>> as_output(3)["data"]["text/plain"]
    '3'
    """
    if isinstance(item, str):
        return {"output_type": "stream", "name": "stdout", "text": item if item.endswith("\n") else item + "\n"}
    if _is_figure(item):
        width, height = (round(v) for v in item.get_size_inches() * item.dpi)
        return {
            "output_type": "display_data",
            "data": {
                "image/png": base64.b64encode(figure_png(item)).decode("ascii"),
                "text/plain": f"<Figure size {width}x{height} with {len(item.axes)} Axes>",
            },
            "metadata": {},
        }
    data: dict = {"text/plain": repr(item)}
    try:
        from IPython.core.formatters import DisplayFormatter

        data, _ = DisplayFormatter().format(item)
    except Exception:
        pass
    return {"output_type": "display_data", "data": data, "metadata": {}}


def _items(result: Any) -> list:
    if result is None:
        return []
    return list(result) if isinstance(result, (list, tuple)) else [result]


class _OutputSink:
    """Where a running experiment's printed text and progress bars go (see ``routed_output``)."""

    def __init__(self, experiment: "Experiment"):
        self.experiment = experiment
        self.lock = threading.Lock()

    def write(self, stream: str, text: str) -> None:
        with self.lock:
            outputs = list(self.experiment.output.outputs)
            if outputs and outputs[-1].get("output_type") == "stream" and outputs[-1].get("name") == stream:
                outputs[-1] = {**outputs[-1], "text": outputs[-1]["text"] + text}
            else:
                outputs.append({"output_type": "stream", "name": stream, "text": text})
            self.experiment.output.outputs = tuple(outputs)

    def show(self, widget) -> None:
        self.experiment.progress_area.children = (widget,)


START_HINT = ("<i>Press {button} to run this experiment in real processes. Just opened the notebook? "
              "Run the cells above first: until they have run, the controls do nothing.</i>")


def _as_shown(control: Any, value: Any) -> str:
    """A control's value as the control shows it: a float at its readout's precision, anything else as repr.

    >>> import ipywidgets as widgets
    >>> _as_shown(widgets.FloatLogSlider(value=10 ** -1.5, readout_format=".3g"), 10 ** -1.5)
    '0.0316'
    >>> _as_shown(widgets.IntSlider(value=2), 2)
    '2'
    """
    fmt = getattr(control, "readout_format", None)
    if isinstance(value, float) and isinstance(fmt, str):
        with contextlib.suppress(ValueError):
            return format(value, fmt)
    return repr(value)


class Experiment:
    """Controls, a run button, a status line, a progress area and an output area around ``run``.

    Build it with :func:`ddpkit.experiment`. ``run(**values)`` receives the
    controls' current values (keyword arguments named like ``controls``) and
    returns what to show: a :class:`matplotlib.figure.Figure`, a ``str``, any
    object with a notebook representation, or a list of those.
    """

    def __init__(self, run: Callable[..., Any], controls: Mapping[str, Any], button: str = "Run"):
        import ipywidgets as widgets

        if not callable(run):
            raise TypeError(f"run must be a function that returns what to show, got {type(run).__name__}")
        missing = [name for name, control in controls.items() if not hasattr(control, "value")]
        if missing:
            raise TypeError(f"controls {missing} have no .value: pass ipywidgets controls such as IntSlider")
        self.run = run
        self.controls = dict(controls)
        self.button = widgets.Button(description=button, button_style="primary", icon="play")
        self.button.add_class("ddpkit-run")
        # Saved with the notebook, this line is what a learner reads before the kernel runs: a saved
        # widget shows its controls, but they do nothing until the cells above have run (issue 26).
        self.status = widgets.HTML(START_HINT.format(button=button))
        self.status.add_class("ddpkit-status")
        self.progress_area = widgets.VBox([])
        self.output = widgets.Output()
        self.output.add_class("ddpkit-output")
        self.widget = widgets.VBox([
            widgets.HBox(list(self.controls.values()) + [self.button], layout=widgets.Layout(flex_flow="row wrap")),
            self.status,
            self.progress_area,
            self.output,
        ])
        self.widget.add_class("ddpkit-experiment")
        self._busy = threading.Lock()
        self.button.on_click(lambda _button: self.click())

    def values(self) -> dict:
        """The controls' current values, as ``run`` receives them."""
        return {name: control.value for name, control in self.controls.items()}

    def click(self) -> bool:
        """Do what pressing the button does (on this thread); False if a run is already in progress."""
        if not self._busy.acquire(blocking=False):
            return False
        self.button.disabled = True
        try:
            values = self.values()
            shown = ", ".join(f"{k}={_as_shown(self.controls[k], v)}" for k, v in values.items())
            self.status.value = f"<i>running {self.run.__name__}({shown}) ...</i>"
            self.output.outputs = ()
            self.progress_area.children = ()
            start = time.monotonic()
            sink = _OutputSink(self)
            try:
                with routed_output(sink):
                    items = _items(self.run(**values))
            except BaseException as exc:  # show it in the widget; a callback's exception would be lost
                text = "".join(traceback.format_exception_only(type(exc), exc))
                sink.write("stderr", text)
                self.status.value = f"<b style='color:#b00'>failed after {time.monotonic() - start:.1f} s</b>"
                if not isinstance(exc, Exception):
                    raise
                return True
            self.output.outputs = self.output.outputs + tuple(as_output(item) for item in items)
            self.status.value = f"done in {time.monotonic() - start:.1f} s"
            return True
        finally:
            self.button.disabled = False
            self._busy.release()

    def run_here(self) -> None:
        """Run with the controls' current values and show the result in the current cell (the plain cell)."""
        from IPython.display import display

        for item in _items(self.run(**self.values())):
            output = as_output(item)
            if output["output_type"] == "stream":
                print(output["text"], end="")
            else:
                display(output["data"], raw=True)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def experiment(run: Callable[..., Any], controls: Mapping[str, Any], *, button: str = "Run") -> Experiment:
    """An experiment: ``controls`` (ipywidgets, by keyword name), a button, and ``run`` behind them.

    ``display(exp)`` shows the controls; pressing the button calls
    ``run(**values)`` and shows what it returns (Figures, strings, objects)
    inside the widget, thread-safely; ``exp.run_here()`` shows the same in
    the current cell (use it in the plain cell with the default values).

    >>> import ipywidgets as widgets
    >>> from matplotlib.figure import Figure
    >>> def squares(n):
    ...     fig = Figure(figsize=(3, 2)); fig.add_subplot().plot([i * i for i in range(n)])
    ...     return [f"{n} squares", fig]
    >>> exp = experiment(squares, {"n": widgets.IntSlider(value=4, min=1, max=10)})
    >>> exp.click()
    True
    >>> [o["output_type"] for o in exp.output.outputs], exp.button.disabled
    (['stream', 'display_data'], False)
    """
    return Experiment(run, controls, button=button)
