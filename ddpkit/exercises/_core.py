"""The machinery behind :func:`ddpkit.exercises.check`: registry, untouched attempts, plain-words answers.

A chapter module registers each checked exercise with :func:`exercise`. Its checker receives the
learner's attempt, runs it on real ranks (``ddpkit.launch``), compares it with a reference and
either returns a sentence saying what was checked or raises :class:`Wrong` with the smallest case
that failed. :func:`check` turns that into a :class:`Result` a learner can read.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from .._errors import LaunchTimeoutError, RankFailedError

RIGHT, WRONG, NOT_ATTEMPTED = "right", "wrong", "not attempted"


@dataclass(frozen=True)
class Result:
    """What a check found: ``status`` is ``"right"``, ``"wrong"`` or ``"not attempted"``.

    Its text is the answer a learner reads; a check cell that ends with ``check(...)`` shows it.

    >>> print(Result("05.1", "right", "05.1 right: checked."))
    05.1 right: checked.
    """

    exercise: str
    status: str
    message: str

    @property
    def ok(self) -> bool:
        """True when the attempt passed every case."""
        return self.status == RIGHT

    def __str__(self) -> str:
        return self.message

    __repr__ = __str__

    def as_dict(self) -> dict[str, str]:
        return {"exercise": self.exercise, "status": self.status, "message": self.message}


class Wrong(Exception):
    """Raised by a checker: the smallest failing case, what was expected, what came back, and a hint.

    ``hint`` points at the section that teaches the idea; it never gives the solution away.
    """

    def __init__(self, case: str, expected: Any, actual: Any, hint: str):
        super().__init__(case)
        self.case, self.expected, self.actual, self.hint = case, expected, actual, hint


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: ``key`` like ``"05.1"``, the chapter file it belongs to, what it asks."""

    key: str
    chapter: str
    title: str
    section: str
    checker: Callable[[Any], str]


_REGISTRY: dict[str, Exercise] = {}


def exercise(key: str, chapter: str, title: str, section: str) -> Callable:
    """Register ``checker`` as the check of exercise ``key`` (``"NN.k"``) in ``chapter``.

    The sentence a checker returns is recorded in the solutions notebooks and compared by strict
    nbval: say what was checked, never a measured value (a time, a rate) that changes from run to run.
    """

    def register(checker: Callable[[Any], str]) -> Callable[[Any], str]:
        if key in _REGISTRY:
            raise ValueError(f"exercise {key} is registered twice")
        _REGISTRY[key] = Exercise(key, chapter, title, section, checker)
        return checker

    return register


def exercises(chapter: str | None = None) -> list[Exercise]:
    """The checked exercises, in order; only those of ``chapter`` (``"05"`` or ``"05_samplers"``) if given.

    >>> [e.key for e in exercises("05")][:1]
    ['05.1']
    """
    found = sorted(_REGISTRY.values(), key=lambda e: tuple(int(p) for p in e.key.split(".")))
    return [e for e in found if chapter is None or e.chapter.startswith(chapter)]


# --------------------------------------------------------------------------- untouched attempts


def _placeholder(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return stmt.value.value is Ellipsis or isinstance(stmt.value.value, str)  # ``...`` or a docstring
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _untouched_node(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return all(_placeholder(s) for s in node.body)
    if isinstance(node, ast.ClassDef):
        methods = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return bool(methods) and all(_untouched_node(m) for m in methods)
    return False


def untouched(attempt: Any) -> bool:
    """True for an attempt still as the chapter ships it: ``...``, or a body of ``...``/``raise NotImplementedError``.

    >>> def attempt(rank, world_size):
    ...     raise NotImplementedError("your code here")
    >>> untouched(attempt), untouched(...), untouched(lambda: 3)
    (True, True, False)
    """
    if attempt is Ellipsis or attempt is None:
        return True
    if isinstance(attempt, dict):
        return any(untouched(v) for v in attempt.values())
    if not callable(attempt):
        return False
    if isinstance(attempt, type):  # a class: judged by its own methods (a notebook class has no source file)
        methods = [v for v in vars(attempt).values() if inspect.isfunction(v)]
        return bool(methods) and all(untouched(m) for m in methods)
    try:
        source = textwrap.dedent(inspect.getsource(attempt))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return False
    return bool(tree.body) and _untouched_node(tree.body[0])


# --------------------------------------------------------------------------- the check


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


def check(key: str, attempt: Any) -> Result:
    """Check the learner's ``attempt`` at exercise ``key`` on real ranks, and say what was found.

    An attempt still as shipped reads "not attempted yet"; a wrong one gets the smallest failing
    case, the expected and the actual value and a hint naming the section that teaches it; one
    that crashes or hangs a rank gets the launcher's report (root-cause rank first) instead of a
    frozen kernel.

    >>> def attempt(n, world_size, rank):
    ...     raise NotImplementedError
    >>> print(check("05.1", attempt))                                         # doctest: +ELLIPSIS
    05.1 not attempted yet: ...
    """
    if key not in _REGISTRY:
        known = ", ".join(e.key for e in exercises())
        raise KeyError(f"no checked exercise {key!r}; the checked exercises are {known}")
    ex = _REGISTRY[key]
    if untouched(attempt):
        return Result(key, NOT_ATTEMPTED, f"{key} not attempted yet: write your answer in the cell above "
                      "(replace the `...` or the `raise NotImplementedError`), run it, then run this cell.")
    try:
        what = ex.checker(attempt)
    except Wrong as w:
        return Result(key, WRONG, "\n".join([
            f"{key} not right yet. The smallest case that fails: {w.case}",
            f"  expected: {_short(w.expected)}",
            f"  got:      {_short(w.actual)}",
            f"  hint: {w.hint}; see the chapter's {ex.section}.",
        ]))
    except (RankFailedError, LaunchTimeoutError) as exc:
        if "NotImplementedError" in str(exc):
            return Result(key, NOT_ATTEMPTED, f"{key} not attempted yet: a rank raised NotImplementedError; "
                          "finish the attempt in the cell above, run it, then run this cell.")
        return Result(key, WRONG, f"{key} not right yet: your code did not finish on the ranks.\n{exc}\n"
                      f"  hint: the chapter's {ex.section} shows code that does.")
    except Exception as exc:  # the learner's code raised in this process
        return Result(key, WRONG, f"{key} not right yet: your code raised {type(exc).__name__}: {exc}\n"
                      f"  hint: the chapter's {ex.section}.")
    return Result(key, RIGHT, f"{key} right: {what}")
