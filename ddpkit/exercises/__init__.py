"""Exercises checked on real ranks, in the notebook (``import ddpkit.exercises``).

Under each chapter exercise that asks for code, an *attempt cell* holds the starting point a learner
edits (a function whose body is ``raise NotImplementedError``), and a *check cell* runs it::

    ddpkit.exercises.check("05.1", padding_duplicates)

The check runs the attempt the way the chapter does, in real process groups through
:func:`ddpkit.launch`, at more than one world size and with the edge cases that catch the usual
mistakes, and compares it with a reference (one process, or the chapter's own result). It answers in
plain words: what is right; for what is wrong, the smallest failing case, the expected and the actual
value, and a hint naming the section that teaches it. An untouched attempt reads "not attempted yet".

Questions that are not code get :func:`reveal`: a box for the learner's answer and a button that
shows the worked one, read from the chapter's solutions notebook. Instructors check a saved notebook
with ``python -m ddpkit check notebooks/05_samplers.ipynb [--json]`` (:func:`check_notebook`).

Each chapter's checks live in a module of their own (``ddpkit.exercises.ch05_samplers``, ...), whose
docstring names the exercises it checks.

>>> import ddpkit.exercises as ex
>>> def padding_duplicates(n, world_size, epoch):
...     raise NotImplementedError("your code here")
>>> print(ex.check("05.1", padding_duplicates))                           # doctest: +ELLIPSIS
05.1 not attempted yet: ...
"""

from . import ch01_env_ranks  # noqa: F401
from . import ch02_init_methods  # noqa: F401
from . import ch03_collectives  # noqa: F401
from . import ch04_ddp  # noqa: F401
from . import ch05_samplers  # noqa: F401  (registers chapter 05's checks)
from . import ch06_elastic  # noqa: F401
from . import ch07_pipeline_parallel  # noqa: F401
from . import ch08_tensor_parallel  # noqa: F401
from . import ch09_sharding  # noqa: F401
from . import ch10_hybrid_parallel  # noqa: F401
from . import ch11_debugging  # noqa: F401
from . import ch12_performance  # noqa: F401
from ._core import Exercise, Result, Wrong, check, exercises, untouched
from ._notebook import attempt_cells, check_notebook
from ._reveal import reveal, worked_answer

__all__ = [
    "Exercise",
    "Result",
    "Wrong",
    "attempt_cells",
    "check",
    "check_notebook",
    "exercises",
    "reveal",
    "untouched",
    "worked_answer",
]
