"""ddpkit: the mechanics behind a hands-on course in PyTorch distributed training.

The notebooks in ``notebooks/`` teach; this package only does the plumbing
they need, so every example runs in real ``torch.distributed`` process groups
on a laptop CPU:

* :func:`launch` runs a notebook function in N real processes
  (chapter 01 onwards);
* :func:`dist_env`, :class:`DistEnv` and :func:`setup_distributed` read the
  launcher's environment and set up the process group, the same way under
  ``ddpkit.launch``, under ``torchrun`` and in a plain process (chapter 01);
* :func:`torchrun` runs the real ``torchrun`` on a script from a notebook,
  also as the ``%%torchrun`` cell magic after ``%load_ext ddpkit``
  (chapters 01 and 06);
* :func:`collective_bandwidth`, :func:`copy_bandwidth`, :func:`plot_ranks`
  and :func:`plot_bandwidth` measure and draw collectives (chapter 03);
* :func:`load_digits`, :func:`digits_mlp`, :func:`exact_accuracy`,
  :func:`max_abs_diff` and :func:`measure_throughput` are the data and
  checks of the training chapters (04 and 05);
* :class:`Timeline`, :func:`plot_timeline` and :func:`idle_fraction` record
  when each rank computed and draw it, bubbles included (chapter 07);
  :func:`check_timing` checks a claim about time again, and says so instead
  of failing when the machine is busy (:func:`machine_busy`);
* :func:`flight_record` and :func:`first_mismatch` compare the ranks'
  flight-recorder entries and name the first collective they disagree on,
  the usual cause of a hang (chapter 11);
* :func:`experiment` builds a chapter's experiment (controls, a Run button,
  pictures drawn thread-safely inside the widget) and :func:`progress` shows
  a live bar per rank during a long launch (every chapter);
* :func:`torch_build` names the PyTorch build (CPU or CUDA wheel, release)
  and :func:`gpu_count` counts GPUs without making later forks unsafe
  (chapter 02);
* ``python -m ddpkit doctor`` checks a machine before class, and
  ``python -m ddpkit lab`` then opens the chapters in JupyterLab.

>>> import ddpkit
>>> ddpkit.launch(lambda: ddpkit.dist_env().rank, world_size=3)
[0, 1, 2]
"""

from ._bench import (
    BandwidthRow,
    bandwidth_table,
    bus_factor,
    check_timing,
    collective_bandwidth,
    copy_bandwidth,
    machine_busy,
    size_meaning,
)
from ._build import TorchBuild, gpu_count, torch_build
from ._data import Digits, PidTagged, digits_mlp, load_digits
from ._env import DistEnv, check_recorded_version, dist_env, patched_environ, setup_distributed, torchrun_environ
from ._errors import LaunchTimeoutError, RankFailedError, RankFailure
from ._flight import Collective, Mismatch, first_mismatch, flight_record
from ._launch import launch, start_method
from ._plot import plot_bandwidth, plot_ranks
from ._progress import progress
from ._timeline import Span, Timeline, idle_fraction, plot_timeline
from ._torchrun import load_ipython_extension, register_magics, torchrun
from ._train import Score, exact_accuracy, max_abs_diff, measure_throughput
from ._widgets import Experiment, experiment

__all__ = [
    "BandwidthRow",
    "Collective",
    "Digits",
    "DistEnv",
    "Experiment",
    "LaunchTimeoutError",
    "Mismatch",
    "PidTagged",
    "RankFailedError",
    "RankFailure",
    "Score",
    "Span",
    "Timeline",
    "TorchBuild",
    "bandwidth_table",
    "bus_factor",
    "check_recorded_version",
    "check_timing",
    "collective_bandwidth",
    "copy_bandwidth",
    "digits_mlp",
    "dist_env",
    "exact_accuracy",
    "experiment",
    "first_mismatch",
    "flight_record",
    "gpu_count",
    "idle_fraction",
    "launch",
    "load_digits",
    "machine_busy",
    "max_abs_diff",
    "measure_throughput",
    "patched_environ",
    "plot_bandwidth",
    "plot_ranks",
    "plot_timeline",
    "progress",
    "register_magics",
    "setup_distributed",
    "size_meaning",
    "start_method",
    "torch_build",
    "torchrun",
    "torchrun_environ",
]

__version__ = "0.1.0"
