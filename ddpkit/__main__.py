"""``python -m ddpkit doctor`` checks this machine; ``python -m ddpkit lab`` checks it, then opens the chapters;
``python -m ddpkit check NOTEBOOK`` checks a learner's exercise attempts (:mod:`ddpkit.exercises`).

See :mod:`ddpkit._doctor`.
"""

from __future__ import annotations

import sys
from typing import Sequence

USAGE = """usage: python -m ddpkit {doctor,lab,check} [options]

  doctor [--json]                  check that this machine can run the course, and say how to fix what cannot
  lab [--notebooks DIR] [--dry-run] [jupyter lab args...]
                                   run the checks, then open the chapters in JupyterLab
  check NOTEBOOK.ipynb... [--json]  check a learner's saved exercise attempts on real ranks, one line each

Add --help after a command for its options."""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the ``doctor``, ``lab`` or ``check`` command; print the usage for anything else."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "check":
        from .exercises import _notebook

        return _notebook.main(rest)
    if command in ("doctor", "lab"):
        from . import _doctor

        try:
            return (_doctor.main if command == "doctor" else _doctor.lab_main)(rest)
        except KeyboardInterrupt as exc:
            print(f"\nstopped: {exc or 'interrupted'}", file=sys.stderr)
            return 130
    print(USAGE, file=sys.stdout if command in ("-h", "--help") else sys.stderr)
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
