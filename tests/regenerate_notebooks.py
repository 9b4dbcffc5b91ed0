"""Re-record notebooks top to bottom, the way their committed outputs must be made.

    .venv/bin/python tests/regenerate_notebooks.py notebooks/01_env_ranks.ipynb [more.ipynb ...]
    .venv/bin/python tests/regenerate_notebooks.py --all

Each notebook runs in a fresh kernel (nbclient) from its own directory, execution counts come out
1..n, and the widgets' state is saved in the notebook's metadata, so an experiment shows its
controls when the notebook is first opened, before any cell runs. The machine's load and core
count are printed beside the time each notebook took: rerun on a quiet machine when the load is
high, since some cells record speed measurements.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def regenerate(path: Path, timeout: int = 600) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)  # nbclient's per-cell timing: noise in diffs
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    load = os.getloadavg()[0]
    start = time.monotonic()
    client.execute()
    seconds = time.monotonic() - start
    nb.metadata["ddpkit"] = {
        "run_all_seconds": round(seconds, 1),
        "cell_seconds": [_cell_seconds(cell) for cell in nb.cells if cell.cell_type == "code"],
        "cores": os.cpu_count(),
        "load_before": round(load, 2),
    }
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)
    return seconds


def _cell_seconds(cell) -> float:
    """One code cell's time from nbclient's record: execute_input to the kernel's reply."""
    timing = cell.get("metadata", {}).get("execution", {})
    try:
        began = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        ended = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0.0  # an empty cell is not sent to the kernel
    return round((ended - began).total_seconds(), 2)


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        paths = [p for d in ("", "deeper", "solutions") for p in sorted((ROOT / "notebooks" / d).glob("*.ipynb"))]
    else:
        paths = [Path(a).resolve() for a in argv]
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        load = os.getloadavg()[0]
        seconds = regenerate(path)
        print(f"{path.relative_to(ROOT)}: {seconds:.1f} s (load before {load:.2f}, {os.cpu_count()} cores)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
