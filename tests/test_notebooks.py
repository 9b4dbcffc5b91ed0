"""Static checks of the chapters (nbval executes them; these check what execution cannot).

Every chapter has the same skeleton, stored outputs come from one clean top-to-bottom run, and the
outputs nbval compares carry nothing that changes from run to run or machine to machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# what must never appear in a compared output: paths, ports, pids, clock times
RUN_SPECIFIC = re.compile(
    r"/tmp/|/work/|/root/|/home/|site-packages|(?:127\.0\.0\.1|localhost):\d+|\bpid[ =:]+\d+|\d\d:\d\d:\d\d\.\d+"
)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _text(output: dict) -> str:
    return "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))


def test_there_are_six_chapters():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_skeleton(path):
    markdown = ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown"]
    assert markdown[0].startswith(f"# {path.name[:2]} · "), "the first cell is the chapter's title"
    assert "**Goals**" in markdown[0]
    headings = [line for text in markdown for line in text.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## 1"), headings
    assert headings[-2:] == ["## Summary", "## Exercises"], headings


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
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
