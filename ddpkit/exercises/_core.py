"""The machinery behind :func:`ddpkit.exercises.check`: registry, untouched attempts, plain-words answers.

A chapter module registers each checked exercise with :func:`exercise`. Its checker receives the
learner's attempt, runs it on real ranks (``ddpkit.launch``), compares it with a reference and
either returns a sentence saying what was checked or raises :class:`Wrong` with the smallest case
that failed. :func:`check` turns that into a :class:`Result` a learner can read.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import signal
import textwrap
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from .._errors import LaunchTimeoutError, RankFailedError

RIGHT, WRONG, NOT_ATTEMPTED = "right", "wrong", "not attempted"
#: The check itself failed (an error in ddpkit's checker or its reference, not in the attempt).
CHECK_ERROR = "check error"
#: How long one call of an attempt that runs in this process (a pure function) may take.
ATTEMPT_TIMEOUT_S = 15


@dataclass(frozen=True)
class Result:
    """What a check found: ``status`` is ``"right"``, ``"wrong"``, ``"not attempted"`` or ``"check error"``.

    ``"check error"`` means the check itself failed (a bug in ddpkit, not a verdict on the attempt).

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


# --------------------------------------------------------------------------- what the learner wrote


class _AttemptTimeout(BaseException):
    """An attempt called in this process ran past :data:`ATTEMPT_TIMEOUT_S` (a BaseException, so that
    an attempt's own ``except Exception`` cannot swallow it)."""


def _call_text(name: str, args: tuple, kwargs: dict) -> str:
    shown = [_plain(a) for a in args] + [f"{k}={_plain(v)}" for k, v in kwargs.items()]
    text = f"{name}({', '.join(shown)})"
    return text if len(text) <= 200 else text[:195] + " ...)"


class _Timed:
    """A learner's function, as the checker gets it: a call made in this process's main thread must
    return within ``limit`` seconds (SIGALRM), and what it raises is marked as the attempt's own.

    On the ranks (another process) and in other threads it calls straight through: there the launcher's
    timeout applies. It pickles by value (its class by reference), so it travels to the ranks as the
    function itself does.
    """

    def __init__(self, fn: Callable, limit: float):
        functools.update_wrapper(self, fn)
        self._fn, self._limit, self._pid = fn, limit, os.getpid()

    def __call__(self, *args, **kwargs):
        timed = (os.getpid() == self._pid and hasattr(signal, "setitimer")
                 and threading.current_thread() is threading.main_thread()
                 and signal.getitimer(signal.ITIMER_REAL)[0] == 0)  # never clobber a timer someone else set
        if not timed:
            return self._fn(*args, **kwargs)
        name, running = getattr(self._fn, "__name__", "your function"), [True]

        def expired(signum, frame):
            if running[0]:  # a signal that arrives as the call returns is ignored
                raise _AttemptTimeout(f"{_call_text(name, args, kwargs)} did not return within {self._limit:g} s")

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, self._limit, 1.0)  # fires again each second if swallowed
        try:
            return self._fn(*args, **kwargs)
        except _AttemptTimeout:
            raise
        except BaseException as exc:
            exc._ddpkit_from_attempt = True  # raised by the attempt itself (or by calling it wrongly)
            raise
        finally:
            while True:  # disarm for sure, even if the signal lands in the middle of this
                try:
                    running[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, previous)
                    break
                except _AttemptTimeout:
                    continue


def _guarded(attempt: Any, limit: float | None = None) -> Any:
    """What the checker receives: a plain function wrapped in :class:`_Timed`, a dict's functions too."""
    limit = ATTEMPT_TIMEOUT_S if limit is None else limit
    if isinstance(attempt, dict):
        return {k: _guarded(v, limit) for k, v in attempt.items()}
    return _Timed(attempt, limit) if inspect.isfunction(attempt) else attempt


def _codes_of(attempt: Any) -> set:
    """The code objects of the attempt's own functions and methods (and of what they define inside)."""
    if isinstance(attempt, dict):
        return set().union(*(_codes_of(v) for v in attempt.values()))
    if isinstance(attempt, type):
        found = set()
        for value in vars(attempt).values():
            value = getattr(value, "__func__", value)  # staticmethod, classmethod
            value = getattr(value, "fget", value)      # property
            found |= _codes_of(value)
        return found
    code = getattr(inspect.unwrap(attempt), "__code__", None) if callable(attempt) else None
    found, todo = set(), [code] if code is not None else []
    while todo:
        code = todo.pop()
        found.add(code)
        todo += [c for c in code.co_consts if inspect.iscode(c) and c not in found]
    return found


def _tb_codes(exc: BaseException) -> list:
    codes, tb = [], exc.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return codes


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 10:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _called_wrongly(exc: BaseException, codes: set) -> bool:
    """A TypeError from calling one of the attempt's functions or methods with the wrong arguments: Python
    raises it before the attempt's first line runs ("f() takes 2 positional arguments but 3 were given")."""
    names = {getattr(c, "co_qualname", c.co_name) for c in codes}
    return isinstance(exc, TypeError) and any(str(exc).startswith(f"{name}()") for name in names)


def _from_attempt(exc: BaseException, codes: set) -> bool:
    """True when the learner's code raised ``exc`` (or an error the check then turned into ``exc``)."""
    return any(getattr(e, "_ddpkit_from_attempt", False) or any(c in codes for c in _tb_codes(e))
               or _called_wrongly(e, codes) for e in _chain(exc))


def _raised_untouched(exc: BaseException, codes: set) -> bool:
    """A NotImplementedError raised by a line of the attempt itself: a placeholder still in place."""
    frames = _tb_codes(exc)
    return isinstance(exc, NotImplementedError) and bool(frames) and frames[-1] in codes


_FRAME_LINE = re.compile(r'^\s*File "(.*)", line \d+, in (\S+)', re.M)


def _rank_untouched(exc: RankFailedError, codes: set) -> bool:
    """The root-cause rank raised NotImplementedError from a line of the attempt itself (its cell, its name)."""
    root = exc.root_cause
    where = _FRAME_LINE.findall(root.traceback)
    return (root.summary.startswith("NotImplementedError") and bool(where)
            and where[-1] in {(c.co_filename, c.co_name) for c in codes})


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(exc.__traceback__)) if exc.__traceback__ else []


# --------------------------------------------------------------------------- the check


def _plain(value: Any) -> str:
    """``repr``, except that strings inside lists, tuples, sets and dicts are always in double quotes."""
    kind = type(value)
    if kind is str:
        return json.dumps(value, ensure_ascii=False)
    if kind in (list, tuple, set, frozenset):
        items = [_plain(v) for v in value]
        if kind is list:
            return "[" + ", ".join(items) + "]"
        if kind is tuple:
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        return "{" + ", ".join(items) + "}" if items else f"{kind.__name__}()"
    if kind is dict:
        return "{" + ", ".join(f"{_plain(k)}: {_plain(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _short(value: Any, limit: int = 300) -> str:
    """A value as a message shows it: a string as it is, anything else as :func:`_plain` writes it.

    >>> print(_short("4 files"), _short(["rank 0's weights", "FileNotFoundError"]), _short({"a": (1,)}))
    4 files ["rank 0's weights", "FileNotFoundError"] {"a": (1,)}
    """
    text = value if isinstance(value, str) else _plain(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def check(key: str, attempt: Any) -> Result:
    """Check the learner's ``attempt`` at exercise ``key`` on real ranks, and say what was found.

    An attempt still as shipped reads "not attempted yet"; a wrong one gets the smallest failing
    case, the expected and the actual value and a hint naming the section that teaches it; one
    that crashes or hangs a rank gets the launcher's report (root-cause rank first) instead of a
    frozen kernel, and a function called in this process that does not return within
    :data:`ATTEMPT_TIMEOUT_S` seconds is stopped and said so. An error of the check's own (not
    raised by the attempt) reads "check error": a bug to report, not a verdict on the attempt.

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
    codes = _codes_of(attempt)
    unfinished = Result(key, NOT_ATTEMPTED, f"{key} not attempted yet: your code raised NotImplementedError; "
                        "finish the attempt in the cell above, run it, then run this cell.")
    try:
        what = ex.checker(_guarded(attempt))
    except Wrong as w:
        return Result(key, WRONG, "\n".join([
            f"{key} not right yet. The smallest case that fails: {w.case}",
            f"  expected: {_short(w.expected)}",
            f"  got:      {_short(w.actual)}",
            f"  hint: {w.hint}; see the chapter's {ex.section}.",
        ]))
    except _AttemptTimeout as exc:
        return Result(key, WRONG, f"{key} not right yet: {exc} (it was stopped there).\n"
                      f"  hint: look for a loop that never ends; the chapter's {ex.section}.")
    except (RankFailedError, LaunchTimeoutError) as exc:
        if isinstance(exc, RankFailedError) and _rank_untouched(exc, codes):
            return unfinished
        return Result(key, WRONG, f"{key} not right yet: your code did not finish on the ranks.\n{exc}\n"
                      f"  hint: the chapter's {ex.section} shows code that does.")
    except Exception as exc:
        if _from_attempt(exc, codes):  # the learner's code raised in this process
            if _raised_untouched(exc, codes):
                return unfinished
            return Result(key, WRONG, f"{key} not right yet: your code raised {_first_line(exc)}\n"
                          f"  hint: the chapter's {ex.section}.")
        frames = _frames(exc)
        where = f"\n  at {frames[-1].filename}, line {frames[-1].lineno}, in {frames[-1].name}" if frames else ""
        return Result(key, CHECK_ERROR, f"{key} could not be checked: the check itself failed, not your code.\n"
                      f"  {_first_line(exc)}{where}\n"
                      "  This is a bug in ddpkit's check: please report it with this message. (If your answer "
                      "returns another kind of value than the exercise asks for, that may be what tripped it.)")
    return Result(key, RIGHT, f"{key} right: {what}")
