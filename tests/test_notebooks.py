"""Static checks of the chapters (nbval executes them; these check what execution cannot).

Every chapter has the same skeleton, stored outputs come from one clean top-to-bottom run, and the
outputs nbval compares carry nothing that changes from run to run or machine to machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))
SOLUTIONS = sorted((NOTEBOOK_DIR / "solutions").glob("*.ipynb"))
DEEPER = sorted((NOTEBOOK_DIR / "deeper").glob("*.ipynb"))  # tests/test_course_shape.py checks their shape
# what must never appear in a compared output: paths, ports, pids, clock times
RUN_SPECIFIC = re.compile(
    r"/tmp/|/work/|/root/|/home/|site-packages|(?:127\.0\.0\.1|localhost):\d+|\bpid[ =:]+\d+|\d\d:\d\d:\d\d\.\d+"
)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _text(output: dict) -> str:
    return "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))


def test_chapters_are_numbered_in_order_each_with_its_solutions():
    assert [p.name[:3] for p in NOTEBOOKS] == [f"{n:02d}_" for n in range(1, len(NOTEBOOKS) + 1)]
    assert len(NOTEBOOKS) >= 7
    assert [p.name for p in SOLUTIONS] == [p.name for p in NOTEBOOKS], "notebooks/solutions/ mirrors the chapters"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_skeleton(path):
    markdown = ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown"]
    assert markdown[0].startswith(f"# {path.name[:2]} · "), "the first cell is the chapter's title"
    assert "**Goals**" in markdown[0]
    headings = [line for text in markdown for line in text.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## 1"), headings
    assert headings[-2:] == ["## Summary", "## Exercises"], headings


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS + DEEPER, ids=lambda p: str(p.relative_to(NOTEBOOK_DIR)))
def test_outputs_come_from_one_clean_run_and_are_reproducible(path):
    code = [c for c in _cells(path) if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), "re-run it top to bottom"
    for number, cell in enumerate(code, 1):
        source = "".join(cell["source"])
        if source.startswith("# NBVAL_IGNORE_OUTPUT"):
            continue
        for output in cell["outputs"]:
            assert output["output_type"] != "error", f"cell [{number}] stored an error"
            found = RUN_SPECIFIC.search(_text(output))
            assert not found, f"cell [{number}] shows run-specific text {found.group()!r}: {_text(output)[:200]!r}"


# --------------------------------------------------------------------------- the evidence rule
#
# Every measured number in the prose (a time, a rate, a ratio, an accuracy, a count) is printed by
# a cell of the same notebook's committed run. What can be checked mechanically: a number that
# looks measured (a decimal, a thousands-separated count, a percentage, a ratio like 3.1x, a
# duration or a rate) must appear in some output of the same notebook. Code spans and blocks are
# exempt (values the code sets, documented defaults quoted as code: `timedelta(minutes=10)`), as
# are version numbers and section references.

_FENCE = re.compile(r"```.*?```", re.S)
_SPAN = re.compile(r"`[^`\n]*`")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_EXEMPT = re.compile(
    r"(?:PyTorch|torch|Python|Jupyter\w*|ipykernel|ipywidgets|matplotlib|version|v)\s*\d+(?:\.\d+)+"
    r"|\d+\.\d+\.\d+|§\s*\d+(?:\.\d+)*|(?:[Ss]ections?|[Cc]hapters?|[Ee]xercises?|[Ss]teps?)\s+\d+(?:\.\d+)*"
    r"|^#+ .*$",
    re.M,
)
MEASURED = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+\.\d+(?:e-?\d+)?|\d+(?:\.\d+)?\s?"
    r"(?:%|x\b|ms\b|s\b|µs\b|us\b|GB/s|MB/s|samples/s|k/s))"
)


def measured_numbers(markdown: str) -> list[str]:
    """The numbers in ``markdown`` that look measured, as their bare numeric text.

    >>> measured_numbers("all_reduce took 1.5 ms, 3x a copy; `timeout=1.5` and §3.2 and PyTorch 2.13 are exempt")
    ['1.5', '3']
    """
    text = _EXEMPT.sub(" ", _COMMENT.sub(" ", _SPAN.sub(" ", _FENCE.sub(" ", markdown))))
    return [re.match(r"[\d,.e-]+", m.group()).group().rstrip(".,") for m in MEASURED.finditer(text)]


def _all_output_text(path: Path) -> str:
    return "\n".join(_text(o) for c in _cells(path) if c["cell_type"] == "code" for o in c["outputs"])


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS + DEEPER, ids=lambda p: str(p.relative_to(NOTEBOOK_DIR)))
def test_every_measured_number_in_the_prose_is_printed_by_a_cell(path):
    printed = _all_output_text(path)
    missing = [
        (number, "".join(c["source"]).split("\n")[0][:60])
        for c in _cells(path) if c["cell_type"] == "markdown"
        for number in measured_numbers("".join(c["source"]))
        if number not in printed
    ]
    assert not missing, f"numbers in the prose that no cell prints (number, cell's first line): {missing}"


def test_the_evidence_rule_catches_an_unbacked_number(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["Training reached 93.4% in 2.5 s."]},
        {"cell_type": "code", "source": ["print(93.4)"], "outputs": [{"output_type": "stream", "text": "93.4\n"}]},
    ]}
    path = tmp_path / "fake.ipynb"
    path.write_text(json.dumps(nb))
    with pytest.raises(AssertionError, match=r"'2\.5'"):
        test_every_measured_number_in_the_prose_is_printed_by_a_cell(path)


# --------------------------------------------------------------------------- solutions and experiments


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_worked_solution_that_the_chapter_links(path):
    markdown = ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown"]
    exercises = "\n".join(markdown).split("\n## Exercises", 1)[-1]  # may span cells, one per exercise
    numbers = [int(n) for n in re.findall(r"^(\d+)\. ", exercises, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and numbers, "exercises are numbered 1..n"
    solutions = sorted((NOTEBOOK_DIR / "solutions").glob(f"{path.name[:3]}*.ipynb"))
    assert len(solutions) == 1, f"expected notebooks/solutions/{path.name[:3]}<name>.ipynb"
    assert f"solutions/{solutions[0].name}" in exercises, "the Exercises section links its solutions notebook"
    solved = "\n".join("".join(c["source"]) for c in _cells(solutions[0]) if c["cell_type"] == "markdown")
    assert solved.startswith(f"# {path.name[:2]} · Solutions"), "the solutions notebook's title"
    for n in numbers:
        assert re.search(rf"^## Exercise {n}\b", solved, flags=re.M), f"no '## Exercise {n}' in {solutions[0].name}"
    assert any(c["cell_type"] == "code" and c["source"] for c in _cells(solutions[0]))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_has_an_experiment_and_its_plain_default_cell(path):
    code = ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "code"]
    built = [i for i, src in enumerate(code) if "ddpkit.experiment(" in src]
    assert built, "build the chapter's experiment with ddpkit.experiment(...)"
    assert any(".run_here()" in src for src in code[built[0]:]), "a plain cell runs it with the defaults"
    assert not any("plt." in src or "pyplot" in src for src in code if "def " in src and "Figure" in src), (
        "functions that build Figures must not use pyplot state"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_states_the_pytorch_version_it_was_recorded_with(path):
    title = "".join(_cells(path)[0]["source"])
    assert "Recorded with PyTorch 2.13.0" in title, "the title cell says 'Recorded with PyTorch 2.13.0 ...'"
    first_code = next("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "code")
    assert "ddpkit.check_recorded_version()" in first_code


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS + DEEPER, ids=lambda p: str(p.relative_to(NOTEBOOK_DIR)))
def test_cell_magic_lines_fit_the_cell(path):
    # a long %%torchrun line runs past a JupyterLab cell's edge: continue it on the next line with "\"
    for cell in _cells(path):
        lines = "".join(cell["source"]).split("\n")
        if cell["cell_type"] != "code" or not lines[0].startswith("%%"):
            continue
        header = [lines[0]]
        while header[-1].endswith("\\") and len(header) < len(lines):
            header.append(lines[len(header)])
        too_long = [line for line in header if len(line) > 90]
        assert not too_long, f"magic lines over 90 characters: {too_long}"


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS + DEEPER, ids=lambda p: str(p.relative_to(NOTEBOOK_DIR)))
def test_every_saved_figure_has_its_picture(path):
    """A figure saved as ``<Figure size ...>`` text alone was never drawn (no ``%matplotlib inline``)."""
    for number, cell in enumerate([c for c in _cells(path) if c["cell_type"] == "code"], 1):
        for output in cell["outputs"]:
            data = output.get("data", {})
            if "".join(data.get("text/plain", "")).startswith("<Figure size"):
                assert "image/png" in data, f"cell [{number}] saved a figure without its picture"


def test_every_cell_has_a_unique_id():
    """nbformat 4.5 requires cell ids: a cell without one makes every reader of the notebook (``python -m ddpkit
    lab``'s trust step, nbval, nbclient) warn "MissingIDFieldWarning: Cell is missing an id field"."""
    bad = {}
    for path in sorted(NOTEBOOK_DIR.rglob("*.ipynb")):
        nb = json.loads(path.read_text())
        ids = [c.get("id") for c in nb["cells"]]
        if (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5) and (None in ids or len(set(ids)) != len(ids)):
            bad[str(path.relative_to(NOTEBOOK_DIR))] = [i for i, c in enumerate(ids) if c is None or ids.count(c) > 1]
    assert not bad, f"cells without a unique id (cell indices): {bad}"


STDERR_LABEL = re.compile(r"\bred\b", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS + DEEPER, ids=lambda p: str(p.relative_to(NOTEBOOK_DIR)))
def test_expected_red_output_is_labelled_as_expected(path):
    """JupyterLab draws standard error on a red background, like a crash. Where a cell's saved output has some, the
    learner is told it is expected: in the markdown right above, or in the cell's leading comment (issue 26)."""
    cells, unlabelled = _cells(path), []
    for i, cell in enumerate(cells):
        if not any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in cell.get("outputs", [])):
            continue
        above = next(("".join(c["source"]) for c in reversed(cells[:i]) if c["cell_type"] == "markdown"), "")
        comment = "\n".join(line for line in "".join(cell["source"]).splitlines()[:6] if line.lstrip().startswith("#"))
        if not (STDERR_LABEL.search(above.split("\n\n")[-1]) or STDERR_LABEL.search(comment)):
            unlabelled.append(i)
    assert not unlabelled, f"cells {unlabelled} show standard error (red) without saying that it is expected"
