"""benchmarks/bucket_sweep.py runs end to end (smoke mode): chapter 12's long bucket sweep, moved out of the notebook."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bucket_sweep.py"


def test_bucket_sweep_smoke():
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("bucket sweep, 2 ranks, 2 steps per setting; alpha = "), lines[0]
    assert lines[1].split()[:3] == ["width", "bucket_cap_mb", "buckets"]
    row = lines[2].split()
    assert row[:3] == ["512", "1", "8"], row                # DDP's 8 rebuilt buckets at bucket_cap_mb=1
    assert all(float(x) > 0 for x in row[3:8]) and row[8] in ("below", "inside", "above")
    assert float(row[5]) >= float(row[4])                   # no overlap costs at least perfect overlap
    assert re.fullmatch(r"settings below the band: \d, inside: \d, above: \d", lines[3]), lines[3]
    assert lines[4].startswith("other programs took ")
