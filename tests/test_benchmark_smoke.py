"""The benchmarks run end to end (smoke mode). Speed goals live in the scripts' output, not in tests."""

import math
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "launch_latency.py"


def test_launch_latency_smoke():
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("launch latency, world size 2, median of 1 run(s), seconds (load ")
    labels = ["ddpkit.launch (warm, fork)", "ddpkit.launch (warm, forkserver)", "ddpkit.launch (warm, spawn)",
              "ddpkit.launch (process, fork)", "mp.spawn (process)", "torchrun (process)"]
    for label, line in zip(labels, lines[1:7]):
        assert line.strip().startswith(label), line
        assert float(line.split()[-5]) > 0
    assert lines[7].startswith("forkserver's one-time start (first launch, PyTorch imported in the server): ")
    assert lines[8].startswith("forkserver / fork (warm) = ") and lines[8].endswith("(goal: <= 3x)")
    assert lines[9].startswith("torchrun / ddpkit.launch (warm, fork) = ")


RUN_ALL = SCRIPT.parent / "run_all.py"
SECTIONS = {  # heading of each figure's table in figures.md -> rows in smoke mode
    "## 1. Launch latency, world size 2": 6,
    "## 2. Relay throughput of ddpkit.launch, world size 2": 6,
    "## 3. all_reduce bus bandwidth vs memory copy at equal sizes": 2,
    "## 4. DDP throughput by world size": 1,
}


def _table(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells without the first column's label) of the table under ``heading``."""
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row[1:]] for row in rows[2:]]  # skip the header and the |---| line


def _number(cell: str) -> float:
    """'12,345.6' -> 12345.6; anything else that is not a number fails the test."""
    assert re.fullmatch(r"\d[\d,]*(\.\d+)?(e[-+]\d+)?", cell), cell
    return float(cell.replace(",", ""))


def test_run_all_smoke(tmp_path):
    done = subprocess.run([sys.executable, str(RUN_ALL), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "figures.md").read_text()
    header = text.split("\n## ", 1)[0]
    for field in ("- date: ", "- command: `", "run_all.py --smoke --out", "- PyTorch 2.", "- cores: ",
                  "- load average (1 / 5 / 15 minutes): before "):
        assert field in header, field
    for heading, count in SECTIONS.items():
        assert heading in done.stdout, heading  # the tables are printed too
        rows = _table(text, heading)
        assert len(rows) == count, (heading, rows)
        for row in rows:
            numbers = [_number(cell) for cell in row if cell != "-"]  # "-": no such figure (speed-up without 1 rank)
            assert numbers and all(0 < x < math.inf for x in numbers), (heading, row)
    assert (tmp_path / "figures.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


STRESS = SCRIPT.parent / "ddp_exit_stress.py"


def test_ddp_exit_stress_smoke():
    """Chapter 04's ending (destroy the group, return with the DDP model alive) exits every time."""
    done = subprocess.run([sys.executable, str(STRESS), "--smoke"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.splitlines()[-2:]
    assert summary[0].startswith("ddp exit stress: 3 runs, world size 2, start method auto, ddpkit's hold on the group on")
    assert summary[1].startswith("hung: 0 of 3; failed otherwise: 0; median finished run "), summary
