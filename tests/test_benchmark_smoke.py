"""The launch benchmark runs end to end (smoke mode). Speed goals live in the script's output, not in tests."""

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
