"""Instructor mode: ``python -m ddpkit check NOTEBOOK [--json]`` checks a learner's saved attempts.

A chapter's attempt cell sits right above its check cell (``ddpkit.exercises.check("NN.k", ...)``)
and imports what it needs, so each pair runs alone, in a fresh namespace, without the rest of the
chapter: a class's notebooks are checked in seconds, not in the minute of a Run All.
"""

from __future__ import annotations

import ast
import json
import linecache
import re
import sys
from pathlib import Path
from typing import Sequence

from ._core import NOT_ATTEMPTED, RIGHT, WRONG, Result

_CHECK = re.compile(r"""check\(\s*["'](\d\d\.\d+)["']""")


def attempt_cells(path: str | Path) -> list[tuple[str, str, str]]:
    """``(key, attempt source, check source)`` for each checked exercise of a notebook, in order."""
    cells = [c for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]
    found = []
    for before, cell in zip([None] + cells, cells):
        source = "".join(cell["source"])
        match = _CHECK.search(source)
        if match and before is not None:
            found.append((match.group(1), "".join(before["source"]), source))
    return found


def _run(key: str, source: str, namespace: dict, what: str):
    filename = f"<{what} of exercise {key}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # inspect.getsource and tracebacks find it
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)
    return eval(compile(ast.Expression(last.value), filename, "eval"), namespace) if last else None


def check_notebook(path: str | Path) -> list[Result]:
    """Run each attempt cell of ``path`` and its check; one :class:`Result` per checked exercise.

    Each attempt runs in a fresh namespace named ``__main__`` (so its functions travel to the ranks by
    value, as a notebook's do) that holds ``ddpkit`` and what the attempt cell imports.
    """
    results = []
    for key, attempt, check in attempt_cells(path):
        import ddpkit

        namespace = {"__name__": "__main__", "__builtins__": __builtins__, "ddpkit": ddpkit}
        try:
            _run(key, attempt, namespace, "the attempt cell")
        except Exception as exc:
            results.append(Result(key, WRONG, f"{key} not right yet: the attempt cell raised "
                                  f"{type(exc).__name__}: {exc}"))
            continue
        try:
            found = _run(key, check, namespace, "the check cell")
        except Exception as exc:
            found = Result(key, WRONG, f"{key} not right yet: the check cell raised {type(exc).__name__}: {exc}")
        results.append(found if isinstance(found, Result) else
                       Result(key, WRONG, f"{key}: the check cell's last line should be ddpkit.exercises.check(...)"))
    return results


def main(argv: Sequence[str]) -> int:
    """``python -m ddpkit check NOTEBOOK... [--json]``: one line per exercise; exit 0 when all are right.

    Exit status 1 when any attempt is wrong, 2 when none is wrong but some are not attempted yet.
    """
    args = list(argv)
    as_json = "--json" in args
    paths = [a for a in args if a != "--json"]
    if not paths or any(a.startswith("-") for a in paths):
        print("usage: python -m ddpkit check NOTEBOOK.ipynb [NOTEBOOK.ipynb ...] [--json]", file=sys.stderr)
        return 2
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    report = {p: check_notebook(p) for p in paths}
    if as_json:
        print(json.dumps({p: [r.as_dict() for r in rs] for p, rs in report.items()}, indent=1))
    else:
        for p, rs in report.items():
            print(f"{p}: {sum(r.ok for r in rs)} of {len(rs)} checked exercises right")
            for r in rs:
                first = r.message.splitlines()[0].removeprefix(f"{r.exercise} not right yet").lstrip(".: ")
                reason = first[:1].lower() + first[1:] if r.status == WRONG else ""
                print(f"  {r.exercise}  {'done' if r.status == RIGHT else r.status}" + (f": {reason}" if reason else ""))
    statuses = {r.status for rs in report.values() for r in rs}
    return 1 if WRONG in statuses else 2 if NOT_ATTEMPTED in statuses else 0
