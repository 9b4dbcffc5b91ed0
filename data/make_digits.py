"""Recreate ``data/digits.csv.gz`` without scikit-learn installed and without the UCI site.

The file is the copy of the UCI "Optical Recognition of Handwritten Digits"
data that scikit-learn ships inside its wheel (``sklearn/datasets/data/``).
This script fetches one scikit-learn wheel with ``pip download`` (no install,
no dependencies), takes that single file out of it, and checks its SHA-256,
so anyone can verify that the file in this repository is the published one::

    python data/make_digits.py            # writes data/digits.csv.gz
    python data/make_digits.py --check    # only verifies the file that is there

The format: 1,797 lines of 65 comma-separated integers, the 64 pixels of an
8x8 image (row by row, 0..16) followed by the label (0..9). ``ddpkit.load_digits``
reads it and applies the fixed split described in ``data/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import subprocess
import sys
import tempfile
import zipfile

SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
MEMBER = "sklearn/datasets/data/digits.csv.gz"
TARGET = pathlib.Path(__file__).resolve().parent / "digits.csv.gz"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "scikit-learn==1.9.1", "-d", tmp],
            check=True,
        )
        (wheel,) = pathlib.Path(tmp).glob("scikit_learn-*.whl")
        with zipfile.ZipFile(wheel) as z:
            return z.read(MEMBER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only verify data/digits.csv.gz")
    check = parser.parse_args().check
    data = TARGET.read_bytes() if check else fetch()
    if sha256(data) != SHA256:
        sys.exit(f"SHA-256 mismatch: got {sha256(data)}, expected {SHA256}")
    if not check:
        TARGET.write_bytes(data)
    print(f"{TARGET.name}: {len(data)} bytes, SHA-256 OK")


if __name__ == "__main__":
    main()
