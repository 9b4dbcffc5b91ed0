"""ddpkit: the mechanics behind a hands-on course in PyTorch distributed training.

The notebooks in ``notebooks/`` teach; this package only does the plumbing
they need, so every example runs in real ``torch.distributed`` process groups
on a laptop CPU:

* :func:`launch` runs a notebook function in N real processes
  (chapter 01 onwards);
* :func:`dist_env`, :class:`DistEnv` and :func:`setup_distributed` read the
  launcher's environment and set up the process group, the same way under
  ``ddpkit.launch``, under ``torchrun`` and in a plain process (chapter 01);
* :func:`torchrun` runs the real ``torchrun`` on a script from a notebook
  (chapters 01 and 06).

>>> import ddpkit
>>> ddpkit.launch(lambda: ddpkit.dist_env().rank, world_size=3)
[0, 1, 2]
"""

from ._env import DistEnv, dist_env, patched_environ, setup_distributed, torchrun_environ
from ._bench import BandwidthRow, bandwidth_table, bus_factor, collective_bandwidth, copy_bandwidth
from ._errors import LaunchTimeoutError, RankFailedError, RankFailure
from ._launch import launch
from ._plot import plot_bandwidth, plot_ranks
from ._torchrun import torchrun

__all__ = [
    "BandwidthRow",
    "DistEnv",
    "LaunchTimeoutError",
    "RankFailedError",
    "RankFailure",
    "bandwidth_table",
    "bus_factor",
    "collective_bandwidth",
    "copy_bandwidth",
    "dist_env",
    "launch",
    "patched_environ",
    "plot_bandwidth",
    "plot_ranks",
    "setup_distributed",
    "torchrun",
    "torchrun_environ",
]

__version__ = "0.1.0"
