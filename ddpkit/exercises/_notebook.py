"""Instructor mode: ``python -m ddpkit check NOTEBOOK [--json]`` checks a learner's saved attempts.

A chapter's attempt cell sits above its check cell (``ddpkit.exercises.check("NN.k", ...)``) and imports
what it needs, so each exercise runs alone, in a fresh namespace, without the rest of the chapter: a
class's notebooks are checked in seconds, not in the minute of a Run All. What runs for an exercise is
the code cells of its part of the notebook, in order, up to its check: from the markdown cell above the
cell that defines what the check is given (the attempt) to the check, never before the previous
exercise's check. A scratch cell the learner added beside the attempt runs too, as it did in the notebook.

Exit status: 0 when every checked exercise is right; 1 when any attempt is wrong; 4 when none is wrong
but a check itself failed (a bug in ddpkit, "check error"); 2 when all the rest are right but some are
not attempted yet; 3 for a usage error (no notebook given, an unknown option, a notebook that does not
exist).
"""

from __future__ import annotations

import ast
import contextlib
import json
import linecache
import re
import sys
from pathlib import Path
from typing import Sequence

from ._core import CHECK_ERROR, NOT_ATTEMPTED, RIGHT, WRONG, Result

_CHECK = re.compile(r"""check\(\s*["'](\d\d\.\d+)["']""")
_REVEAL = re.compile(r"""reveal\(\s*["'](\d\d\.\d+)["']""")

USAGE = """usage: python -m ddpkit check NOTEBOOK.ipynb [NOTEBOOK.ipynb ...] [--json]

Checks a learner's saved exercise attempts on real ranks: one line per exercise (--json: a gradebook).
exit status: 0 all right, 1 some wrong, 2 the rest right but some not attempted yet,
             3 usage error, 4 a check itself failed (a bug in ddpkit; none wrong)"""
#: Exit statuses of ``python -m ddpkit check``.
EXIT_RIGHT, EXIT_WRONG, EXIT_NOT_ATTEMPTED, EXIT_USAGE, EXIT_CHECK_ERROR = 0, 1, 2, 3, 4


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _defined(source: str) -> set[str]:
    """The names a cell binds at its top level (def, class, assignment, import)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if target is not None:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _checked_names(source: str) -> set[str]:
    """The names the check cell hands to ``check("NN.k", ...)``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant):
            names |= {n.id for a in node.args[1:] for n in ast.walk(a) if isinstance(n, ast.Name)}
    return names


def _exercise_cells(path: str | Path) -> list[tuple[str, list[str], int, str]]:
    """``(key, code cells that run before the check, which of them is the attempt, check source)``."""
    cells = json.loads(Path(path).read_text())["cells"]
    found, floor = [], -1  # floor: the previous exercise's check (or reveal) cell
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = _source(cell)
        match = _CHECK.search(source)
        if not match:
            if _REVEAL.search(source):
                floor = i
            continue
        code = [j for j in range(floor + 1, i) if cells[j]["cell_type"] == "code"]
        wanted = _checked_names(source)
        attempt = next((j for j in reversed(code) if wanted & _defined(_source(cells[j]))), code[-1] if code else None)
        if attempt is not None:
            heading = next((j for j in range(attempt - 1, floor, -1) if cells[j]["cell_type"] == "markdown"),
                           attempt - 1)
            run = [j for j in code if j > heading]
            found.append((match.group(1), [_source(cells[j]) for j in run], run.index(attempt), source))
        floor = i
    return found


def attempt_cells(path: str | Path) -> list[tuple[str, str, str]]:
    """``(key, attempt source, check source)`` for each checked exercise of a notebook, in order.

    The attempt is the code cell nearest above the check that defines what the check is given.
    """
    return [(key, run[k], check) for key, run, k, check in _exercise_cells(path)]


def _run(key: str, source: str, namespace: dict, what: str):
    filename = f"<{what} of exercise {key}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # inspect.getsource and tracebacks find it
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)
    return eval(compile(ast.Expression(last.value), filename, "eval"), namespace) if last else None


def check_notebook(path: str | Path) -> list[Result]:
    """Run each exercise's cells of ``path`` and its check; one :class:`Result` per checked exercise.

    Each exercise runs in a fresh namespace named ``__main__`` (so its functions travel to the ranks by
    value, as a notebook's do) that holds ``ddpkit`` and what its cells import. A cell that raises is
    reported only if the check then cannot run; what the cells print goes to stderr.
    """
    import ddpkit

    results = []
    for key, run, attempt, check in _exercise_cells(path):
        namespace = {"__name__": "__main__", "__builtins__": __builtins__, "ddpkit": ddpkit}
        failed = None
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the report (and --json)
            for k, source in enumerate(run):
                what = "the attempt cell" if k == attempt else f"cell {k + 1} of this exercise"
                try:
                    _run(key, source, namespace, what)
                except Exception as exc:
                    failed = failed or (what, exc)
            try:
                found = _run(key, check, namespace, "the check cell")
            except Exception as exc:
                what, exc = failed or ("the check cell", exc)
                found = Result(key, WRONG, f"{key} not right yet: {what} raised {type(exc).__name__}: {exc}")
        results.append(found if isinstance(found, Result) else
                       Result(key, WRONG, f"{key}: the check cell's last line should be ddpkit.exercises.check(...)"))
    return results


def main(argv: Sequence[str]) -> int:
    """``python -m ddpkit check NOTEBOOK... [--json]``: one line per exercise; exit 0 when all are right.

    Exit status 1 when any attempt is wrong, 4 when none is wrong but a check itself failed, 2 when the
    rest are right but some are not attempted yet, 3 for a usage error.
    """
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return EXIT_RIGHT
    as_json = "--json" in args
    paths = [a for a in args if a != "--json"]
    if not paths or any(a.startswith("-") for a in paths):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    report = {p: check_notebook(p) for p in paths}
    if as_json:
        print(json.dumps({p: [r.as_dict() for r in rs] for p, rs in report.items()}, indent=1))
    else:
        for p, rs in report.items():
            print(f"{p}: {sum(r.ok for r in rs)} of {len(rs)} checked exercises right")
            for r in rs:
                first = r.message.splitlines()[0].removeprefix(f"{r.exercise} not right yet").lstrip(".: ")
                first = first.removeprefix(f"{r.exercise} ")
                reason = first[:1].lower() + first[1:] if r.status in (WRONG, CHECK_ERROR) else ""
                print(f"  {r.exercise}  {'done' if r.status == RIGHT else r.status}" + (f": {reason}" if reason else ""))
    statuses = {r.status for rs in report.values() for r in rs}
    for status, code in ((WRONG, EXIT_WRONG), (CHECK_ERROR, EXIT_CHECK_ERROR), (NOT_ATTEMPTED, EXIT_NOT_ATTEMPTED)):
        if status in statuses:
            return code
    return EXIT_RIGHT
