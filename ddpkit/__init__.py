"""ddpkit: the mechanics behind a hands-on course in PyTorch distributed training.

The notebooks in ``notebooks/`` teach; this package only does the plumbing
they need, so every example runs in real ``torch.distributed`` process groups
on a laptop CPU:

* :func:`launch` runs a notebook function in N real processes
  (chapter 01 onwards);
* :func:`dist_env`, :class:`DistEnv` and :func:`setup_distributed` read the
  launcher's environment and set up the process group, the same way under
  ``ddpkit.launch``, under ``torchrun`` and in a plain process, and
  :func:`rank_table` and :func:`plot_cluster` show how the ranks are
  numbered (chapter 01);
* :func:`torchrun` runs the real ``torchrun`` on a script from a notebook,
  also as the ``%%torchrun`` cell magic after ``%load_ext ddpkit``
  (chapters 01 and 06);
* :func:`collective_bandwidth`, :func:`copy_bandwidth`, :func:`plot_ranks`,
  :func:`plot_ring_steps` and :func:`plot_bandwidth` measure and draw
  collectives (chapter 03);
* :func:`load_digits`, :func:`digits_mlp`, :func:`exact_accuracy`,
  :func:`max_abs_diff` and :func:`measure_throughput` are the data and
  checks of the training chapters (04 and 05);
* :class:`Timeline`, :func:`plot_timeline`, :func:`idle_fraction` and
  :func:`replay_pipeline` record when each rank computed and draw it,
  bubbles included (chapter 07);
  :func:`check_timing` checks a claim about time again, and says so instead
  of failing when the machine is busy (:func:`machine_busy`);
* :func:`flight_record` and :func:`first_mismatch` compare the ranks'
  flight-recorder entries and name the first collective they disagree on,
  the usual cause of a hang (chapter 11);
* :func:`quiet_mesh`, :class:`Traffic`, :func:`group_link`, :func:`plan_table`,
  :func:`plot_mesh_groups` and :func:`plot_cluster_groups` build meshes, record
  each rank's collectives, model a cluster's links and draw the groups
  (chapter 10);
* :func:`experiment` builds a chapter's experiment (controls, a Run button,
  pictures drawn thread-safely inside the widget) and :func:`progress` shows
  a live bar per rank during a long launch (every chapter);
* :func:`torch_build` names the PyTorch build (CPU or CUDA wheel, release)
  and :func:`gpu_count` counts GPUs without making later forks unsafe
  (chapter 02);
* :mod:`ddpkit.exercises` checks a learner's exercise attempts on real
  ranks (``ddpkit.exercises.check("05.1", attempt)``), and
  ``python -m ddpkit check NOTEBOOK`` checks a saved notebook's (every chapter);
* ``python -m ddpkit doctor`` checks a machine before class, and
  ``python -m ddpkit lab`` then opens the chapters in JupyterLab.

>>> import ddpkit
>>> ddpkit.launch(lambda: ddpkit.dist_env().rank, world_size=3)
[0, 1, 2]
"""

from ._bench import (
    BandwidthRow,
    CpuUse,
    bandwidth_table,
    bus_factor,
    check_timing,
    collective_bandwidth,
    copy_bandwidth,
    cpu_use,
    machine_busy,
    size_meaning,
)
from ._bars import plot_bars
from ._build import TorchBuild, gpu_count, torch_build
from ._data import Digits, PidTagged, digits_mlp, load_digits
from ._env import (
    DistEnv,
    check_recorded_version,
    dist_env,
    patched_environ,
    rank_table,
    setup_distributed,
    torchrun_environ,
)
from ._errors import LaunchTimeoutError, RankFailedError, RankFailure
from ._flight import Collective, Mismatch, first_mismatch, flight_record
from ._launch import launch, start_method
from ._memory import memory_table, plot_memory
from ._plot import (
    number_attempts,
    plot_arrivals,
    plot_bandwidth,
    plot_cluster,
    plot_digits,
    plot_holdings,
    plot_partition,
    plot_ranks,
    plot_rendezvous,
    plot_restarts,
    plot_ring_steps,
    plot_runs,
)
from ._progress import progress
from ._timeline import Span, Timeline, idle_fraction, plot_timeline, replay_pipeline
from ._torchrun import load_ipython_extension, register_magics, torchrun
from ._train import Score, exact_accuracy, max_abs_diff, measure_throughput, relative_gaps
from ._widgets import Experiment, experiment

# Loaded on first use, because they import torch: ``import ddpkit`` itself stays light (the doctor, a
# ``%%torchrun`` worker and a forked rank import ddpkit without paying torch's seconds of start-up).
_LAZY = {
    "Traffic": "_cluster", "group_link": "_cluster", "plan_table": "_cluster",
    "plot_cluster_groups": "_cluster", "plot_mesh_groups": "_cluster", "quiet_mesh": "_cluster",
    "exercises": None,  # the subpackage itself
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ddpkit' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "BandwidthRow",
    "Collective",
    "CpuUse",
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
    "Traffic",
    "bandwidth_table",
    "bus_factor",
    "check_recorded_version",
    "check_timing",
    "collective_bandwidth",
    "copy_bandwidth",
    "cpu_use",
    "digits_mlp",
    "dist_env",
    "exact_accuracy",
    "exercises",
    "experiment",
    "first_mismatch",
    "flight_record",
    "gpu_count",
    "group_link",
    "idle_fraction",
    "launch",
    "load_digits",
    "machine_busy",
    "max_abs_diff",
    "measure_throughput",
    "memory_table",
    "number_attempts",
    "patched_environ",
    "plan_table",
    "plot_arrivals",
    "plot_bandwidth",
    "plot_bars",
    "plot_cluster",
    "plot_cluster_groups",
    "plot_digits",
    "plot_holdings",
    "plot_memory",
    "plot_mesh_groups",
    "plot_partition",
    "plot_ranks",
    "plot_rendezvous",
    "plot_restarts",
    "plot_ring_steps",
    "plot_runs",
    "plot_timeline",
    "progress",
    "quiet_mesh",
    "rank_table",
    "register_magics",
    "relative_gaps",
    "replay_pipeline",
    "setup_distributed",
    "size_meaning",
    "start_method",
    "torch_build",
    "torchrun",
    "torchrun_environ",
]

__version__ = "0.1.0"
