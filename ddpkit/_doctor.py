"""``python -m ddpkit doctor``: is this machine ready for the course? If not, what to do.

Run it once before class. Each check protects against one way a chapter
can fail on a learner's machine, and each problem comes with one sentence
saying how to fix it (exit code 1 when something FAILs, 0 otherwise):

* **python**, **torch**: Python 3.10 or newer is required. The torch line
  names the build (CPU or CUDA wheel, its CUDA runtime, the GPUs it sees;
  see :mod:`ddpkit._build`) and the release. The chapters' saved outputs
  were recorded with :data:`RECORDED_WITH` on the CPU wheel; another
  release from :data:`OLDEST_TORCH` to :data:`NEWEST_TORCH` (the range the
  tests ran) runs them but may word messages differently (WARN), a newer one
  is untested (WARN), an older one is not supported (FAIL).
* **start_methods**: how new processes start. ``fork`` copies this process
  (milliseconds) but is unsafe after CUDA or OpenMP threads started, and
  macOS cannot fork safely at all; ``spawn`` starts fresh interpreters
  (seconds); Python 3.14 made ``forkserver`` the Linux default. The check
  asks ``ddpkit.launch`` which one ``start_method="auto"`` picks here, and why.
* **gloo**, **loopback**, **launch**: the CPU backend must be in this
  PyTorch build, the ranks talk over the 127.0.0.1 interface, and then a
  real 2-rank ``ddpkit.launch`` with an ``all_reduce`` proves the whole
  chain (timed: the first launch also imports what the ranks share).
* **ports**: rendezvous needs a free TCP port on 127.0.0.1; ``torchrun``
  uses 29500 unless told otherwise, and fails if something else holds it.
* **cores**: the chapters start up to 8 processes (world size 8 in
  chapter 01). They run on any number of cores, taking turns; fewer cores
  only make them slower.
* **jupyterlab**, **widgets**: the chapters are notebooks with interactive
  widgets; without the ``@jupyter-widgets/jupyterlab-manager`` lab extension
  a widget shows up as a line of text such as ``HBox(children=...)``.
* **ptrace**: stack tools such as ``py-spy dump --pid`` attach to a running
  rank with ``ptrace``, which Linux's Yama setting
  ``/proc/sys/kernel/yama/ptrace_scope`` may restrict to parents or root.

Every check is a small function returning a :class:`Check`; :func:`run_checks`
runs them all and :func:`main` prints them (``--json`` for programs).
``python -m ddpkit lab`` (:func:`lab_main`) runs them before starting JupyterLab.

>>> c = check_python((3, 9, 18))
>>> c.status, c.fix
('FAIL', 'Install Python 3.10 or newer (3.11 matches the recordings) and recreate .venv with it.')
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import socket
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Sequence

from ._env import RECORDED_WITH  # what the chapters' saved outputs were recorded with

#: The oldest PyTorch the package supports.
OLDEST_TORCH = "2.11"
NEWEST_TORCH = "2.15"
OLDEST_PYTHON = (3, 10)
#: ``torchrun``'s default ``--master_port``.
TORCHRUN_PORT = 29500
#: The largest world size the chapters launch (chapter 01: 2 machines x 4 processes).
CHAPTER_WORLD_SIZE = 8
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
_CAP_SYS_PTRACE = 19  # bit in /proc/self/status CapEff


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's result: ``status`` is ``"OK"``, ``"WARN"`` (works, but read this) or ``"FAIL"``.

    ``found`` says what the check saw; ``fix`` (empty when OK) says what to do.
    """

    name: str
    status: str
    found: str
    fix: str = ""


def _release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the numeric release, without local or pre-release tags."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in match.group().split(".")) if match else ()


# --------------------------------------------------------------------------- versions


def check_python(version: Sequence[int] | None = None) -> Check:
    """Python >= 3.10 (``version`` defaults to this interpreter's; pass one to see the verdict for it)."""
    version = tuple(sys.version_info[:3] if version is None else version)
    text = ".".join(map(str, version))
    recorded = RECORDED_WITH["python"]
    if version[:2] < OLDEST_PYTHON:
        return Check(
            "python", "FAIL", f"{text}; ddpkit needs 3.10 or newer",
            f"Install Python 3.10 or newer ({recorded} matches the recordings) and recreate .venv with it.",
        )
    return Check("python", "OK", f"{text} (chapters recorded with {recorded}) at {sys.executable}")


def _kind(version: str) -> str:
    """The wheel kind a version's local tag names: ``+cpu`` CPU, ``+cuXXX`` CUDA, ``+rocmX`` ROCm (else CPU)."""
    local = version.partition("+")[2]
    return "CUDA" if local.startswith("cu") else "ROCm" if local.startswith("rocm") else "CPU"


def check_torch(version: str | None = None, build: str | None = None) -> Check:
    """PyTorch installed, >= :data:`OLDEST_TORCH`, ideally the recorded release and build.

    ``version`` defaults to torch's, ``build`` (how the found line describes
    it) to :func:`ddpkit.torch_build`; the wheel kind comes from the build
    itself, or, for a ``version`` passed in, from its local tag (``+cpu``,
    ``+cu130``).
    """
    recorded = RECORDED_WITH["torch"]
    install = f"Run `{sys.executable} -m pip install torch=={recorded}` (the version the chapters were recorded with)."
    if version is None:
        try:
            import torch
        except ImportError as exc:
            return Check("torch", "FAIL", f"cannot import torch: {exc}", install)
        from ._build import torch_build

        version = torch.__version__
        found = torch_build()
        kind = found.kind  # from the build itself: a conda CUDA build has no +cu tag
        build = str(found) if build is None else build
    else:
        kind = _kind(version)
    shown = build or f"torch {version}"
    release = _release(version)[:2]
    if release < _release(OLDEST_TORCH)[:2]:
        return Check("torch", "FAIL", f"{shown}; ddpkit needs {OLDEST_TORCH} or newer", install)
    if release > _release(NEWEST_TORCH)[:2]:
        return Check(
            "torch", "WARN",
            f"{shown}; newer than the releases ddpkit was tested with ({OLDEST_TORCH} to {NEWEST_TORCH})",
            f"It may work; if a chapter fails, run `{sys.executable} -m pip install torch=={recorded}`.",
        )
    as_recorded = f"{recorded}, {RECORDED_WITH['build']} build"
    if _release(version)[:3] != _release(recorded)[:3] or kind != RECORDED_WITH["build"]:
        return Check(
            "torch", "WARN",
            f"{shown}; the chapters were recorded with {as_recorded}, so some messages may read differently",
            f"Nothing breaks. To match the saved outputs exactly, install the CPU wheel of {recorded}: "
            f"`{sys.executable} -m pip install torch=={recorded} --index-url https://download.pytorch.org/whl/cpu` "
            "(a plain `pip install torch==...` on Linux gives the CUDA wheel).",
        )
    return Check("torch", "OK", f"{shown} (chapters recorded with {as_recorded})")


# --------------------------------------------------------------------------- processes


def check_start_methods() -> Check:
    """Which start methods exist, Python's default, and what ``ddpkit.launch(start_method="auto")`` picks and why."""
    import multiprocessing

    from ._launch import start_method

    available = multiprocessing.get_all_start_methods()
    # the method set by set_start_method, else the platform's default (documented as the first one listed)
    default = multiprocessing.get_start_method(allow_none=True) or available[0]
    note = " (Linux's default since Python 3.14)" if default == "forkserver" else ""
    picked, why = start_method(threads=1)
    found = (
        f"available: {', '.join(available)}; Python's default: {default}{note}; "
        f"ddpkit.launch(start_method='auto') picks {picked}: {why}"
    )
    found += f"; with OMP_NUM_THREADS > 1 per rank it picks {start_method(threads=2)[0]}"
    if "spawn" not in available:
        return Check("start_methods", "FAIL", found, "Use a standard CPython build from python.org or your OS.")
    return Check("start_methods", "OK", found)


def _all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return t.item()


def check_gloo() -> Check:
    """The gloo backend (CPU collectives) is compiled into this PyTorch build."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return Check(
            "gloo", "FAIL", "this PyTorch build has no torch.distributed gloo backend",
            f"Install a standard PyTorch build: `{sys.executable} -m pip install torch=={RECORDED_WITH['torch']}`.",
        )
    return Check("gloo", "OK", "torch.distributed with the gloo backend is available")


def check_loopback() -> Check:
    """An interface carries 127.0.0.1, where ``ddpkit.launch`` tells gloo to listen."""
    from ._launch import _loopback_interface

    name = _loopback_interface()
    if name is None:
        return Check(
            "loopback", "FAIL", "no network interface has the address 127.0.0.1",
            "Bring the loopback interface up (Linux: `sudo ip link set lo up`; "
            "in a container, do not start it with --network none).",
        )
    override = os.environ.get("GLOO_SOCKET_IFNAME")
    extra = f"; GLOO_SOCKET_IFNAME={override} is set and wins" if override else ""
    return Check("loopback", "OK", f"interface {name} has 127.0.0.1 (gloo listens there){extra}")


def check_launch(world_size: int = 2, timeout: float = 60.0) -> Check:
    """The end-to-end proof: a real ``ddpkit.launch`` of ``world_size`` ranks running one ``all_reduce``."""
    from . import _launch

    expected = [float(sum(range(1, world_size + 1)))] * world_size
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = _launch.launch(_all_reduce_rank, world_size, timeout=timeout)
    except Exception as exc:
        lines = str(exc).strip().splitlines() or [""]
        return Check(
            "launch", "FAIL", f"{type(exc).__name__}: {' / '.join(lines[:3])}",
            "Fix the FAIL checks above first; if all else is OK, run `import ddpkit; ddpkit.launch(print, 2)` "
            "in Python to see the full error.",
        )
    seconds = time.perf_counter() - start
    if result != expected:
        return Check("launch", "FAIL", f"all_reduce returned {result}, expected {expected}",
                     "Reinstall PyTorch; its gloo all_reduce gives wrong sums here.")
    found = f"{world_size} ranks, all_reduce -> {result} in {seconds:.1f} s (with one-time imports)"
    return Check("launch", "OK", found)


# --------------------------------------------------------------------------- machine


def _port_in_use(port: int) -> bool:
    """True when something listens on ``port`` or holds it (bound like a rendezvous store binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_ports(port: int = TORCHRUN_PORT) -> Check:
    """A TCP port can be bound on 127.0.0.1, and whether ``port`` (torchrun's default, 29500) is free."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
    except OSError as exc:
        return Check(
            "ports", "FAIL", f"cannot bind a TCP port on 127.0.0.1: {exc}",
            "Allow this user to open local TCP sockets (check the firewall, sandbox or container's network settings).",
        )
    if _port_in_use(port):
        return Check(
            "ports", "WARN", f"127.0.0.1 can bind ports (e.g. {free}), but port {port} is in use",
            f"Give torchrun another port with `--master_port=29501` (or use `--standalone`), or stop what holds {port}.",
        )
    return Check("ports", "OK", f"127.0.0.1 can bind ports (e.g. {free}); port {port} (torchrun's default) is free")


def check_cores(cpu_count: int | None = None, usable: int | None = None) -> Check:
    """CPU cores (all, and those this process may use) against the chapters' 8 processes."""
    cpu_count = os.cpu_count() if cpu_count is None else cpu_count
    if usable is None and hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    found = f"{cpu_count} core(s) (os.cpu_count())"
    if usable is not None:
        found += f", {usable} usable by this process (os.sched_getaffinity)"
    found += f"; the chapters start up to {CHAPTER_WORLD_SIZE} processes, which share them"
    if (usable or cpu_count or 1) < 2:
        return Check(
            "cores", "WARN", found,
            "Nothing to fix to run the chapters (the ranks take turns, just slower); give this machine or container "
            "2 or more cores (e.g. `docker run --cpus=4`) to make them faster.",
        )
    return Check("cores", "OK", found)


# --------------------------------------------------------------------------- JupyterLab


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _labextension_dirs() -> list[Path]:
    """Where JupyterLab looks for prebuilt extensions: this environment's, plus the user's and system's."""
    dirs = [Path(sys.prefix, "share", "jupyter", "labextensions")]
    with contextlib.suppress(ImportError):
        from jupyter_core.paths import jupyter_path

        dirs += [Path(p) for p in jupyter_path("labextensions") if Path(p) not in dirs]
    return dirs


def check_jupyterlab() -> Check:
    """JupyterLab and ipykernel installed in this environment (WARN only: tests run without them)."""
    lab, kernel = _version("jupyterlab"), _version("ipykernel")
    if lab is None:
        return Check(
            "jupyterlab", "WARN", f"JupyterLab is not installed in {sys.prefix}",
            f"To open the chapters, run `{sys.executable} -m pip install -e \".[lab]\"` in the course folder.",
        )
    if kernel is None:
        return Check("jupyterlab", "WARN", f"jupyterlab {lab}, but no ipykernel: notebooks cannot run",
                     f"Run `{sys.executable} -m pip install ipykernel`.")
    return Check("jupyterlab", "OK", f"jupyterlab {lab}, ipykernel {kernel}")


def check_widgets() -> Check:
    """ipywidgets installed, and JupyterLab's widget extension present, in a matching major version."""
    widgets = _version("ipywidgets")
    if widgets is None:
        return Check("widgets", "FAIL", "ipywidgets is not installed (ddpkit depends on it)",
                     f"Run `{sys.executable} -m pip install -e .` in the course folder.")
    found = [d / WIDGETS_EXTENSION for d in _labextension_dirs() if (d / WIDGETS_EXTENSION).is_dir()]
    if not found:
        return Check(
            "widgets", "WARN",
            f"ipywidgets {widgets}, but no {WIDGETS_EXTENSION} lab extension: widgets would show as text",
            f"Run `{sys.executable} -m pip install jupyterlab_widgets`, then restart JupyterLab.",
        )
    extension = "?"  # its package.json says which version
    with contextlib.suppress(OSError, ValueError):
        extension = json.loads((found[0] / "package.json").read_text()).get("version", "?")
    wanted = {8: 5, 7: 3}.get((_release(widgets) or (0,))[0])  # ipywidgets major -> extension major
    text = f"ipywidgets {widgets}; lab extension {extension} in {found[0].parent.parent}"
    if wanted is not None and _release(extension)[:1] != (wanted,):
        return Check("widgets", "WARN", f"{text}, which does not match ipywidgets {widgets}",
                     f"Run `{sys.executable} -m pip install -U ipywidgets jupyterlab_widgets`, then restart JupyterLab.")
    return Check("widgets", "OK", text)


# --------------------------------------------------------------------------- stack tools


def _can_ptrace_any() -> bool:
    """True when this process holds CAP_SYS_PTRACE (root usually does; containers often drop it)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        caps = next(line for line in status if line.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    return hasattr(os, "geteuid") and os.geteuid() == 0


def check_ptrace(path: str = PTRACE_SCOPE) -> Check:
    """Can a stack tool such as ``py-spy dump --pid`` attach to a running rank? (Linux's Yama ptrace_scope.)"""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    who = "running as root" if root else "not running as root"
    try:
        scope = int(Path(path).read_text().strip())
    except FileNotFoundError:
        return Check("ptrace", "OK", f"not applicable: no {path} (no Yama restrictions); {who}")
    if scope == 0:
        return Check("ptrace", "OK", f"ptrace_scope 0: py-spy can attach to your own processes; {who}")
    if scope in (1, 2) and _can_ptrace_any():
        return Check("ptrace", "OK", f"ptrace_scope {scope}, but this user holds CAP_SYS_PTRACE; {who}")
    if scope == 1:
        return Check(
            "ptrace", "WARN", f"ptrace_scope 1: only a parent may attach, so py-spy cannot dump a running rank; {who}",
            "Run py-spy with sudo (`sudo py-spy dump --pid PID`) or allow attaching until reboot with "
            "`sudo sysctl kernel.yama.ptrace_scope=0`.",
        )
    return Check(
        "ptrace", "WARN", f"ptrace_scope {scope}: only {'admins' if scope == 2 else 'nobody'} may attach; {who}",
        "Run py-spy with sudo (`sudo py-spy dump --pid PID`), or let py-spy start the program itself "
        "(`py-spy record -- python train.py`).",
    )


# --------------------------------------------------------------------------- running and printing

CHECKS: tuple[Callable[[], Check], ...] = (
    check_python, check_torch, check_start_methods, check_gloo, check_loopback, check_ports,
    check_launch, check_cores, check_jupyterlab, check_widgets, check_ptrace,
)


def _run_one(check: Callable[[], Check]) -> Check:
    """Run one check; an unexpected error becomes that check's FAIL instead of stopping the doctor."""
    try:
        return check()
    except Exception as exc:
        return Check(
            getattr(check, "__name__", "check").removeprefix("check_"), "FAIL", f"{type(exc).__name__}: {exc}",
            "Fix the FAIL checks above first (usually torch); if this one stays, send this output to your instructor.",
        )


def run_checks(checks: Sequence[Callable[[], Check]] = CHECKS) -> list[Check]:
    """Run every check (about 2-5 s: one of them launches 2 real processes); return their records.

    >>> [c.name for c in run_checks()]  # doctest: +SKIP
    ['python', 'torch', 'start_methods', 'gloo', 'loopback', 'ports', 'launch', 'cores', 'jupyterlab', ...]
    """
    return [_run_one(check) for check in checks]


def format_report(checks: Sequence[Check], width: int | None = None) -> str:
    """The table (name, status, what was found), then one line with the fix for each WARN and FAIL.

    >>> print(format_report([Check("ports", "WARN", "port 29500 is in use", "Pass --master_port.")], width=60))
    check  status  found
    ports  WARN    port 29500 is in use
    <BLANKLINE>
    To fix:
      WARN ports: Pass --master_port.
    """
    width = width or shutil.get_terminal_size((100, 24)).columns
    name_w = max([len("check")] + [len(c.name) for c in checks])
    indent = name_w + 2 + 6 + 2
    lines = [f"{'check':<{name_w}}  {'status':<6}  found"]
    for c in checks:
        wrapped = textwrap.wrap(c.found, max(30, width - indent)) or [""]
        lines.append(f"{c.name:<{name_w}}  {c.status:<6}  {wrapped[0]}")
        lines += [" " * indent + more for more in wrapped[1:]]
    fixes = [c for c in checks if c.status != "OK"]
    if fixes:
        lines += ["", "To fix:"]
        for c in sorted(fixes, key=lambda c: c.status != "FAIL"):
            fix = f"{c.status} {c.name}: {c.fix}"
            lines += textwrap.wrap(fix, width - 2, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def summary(checks: Sequence[Check]) -> str:
    """One line: how many checks passed, warned, failed.

    >>> summary([Check("a", "OK", ""), Check("b", "WARN", "", "do this")])
    'doctor: 2 checks: 1 OK, 1 WARN, 0 FAIL'
    """
    counts = {s: sum(c.status == s for c in checks) for s in ("OK", "WARN", "FAIL")}
    return f"doctor: {len(checks)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def main(argv: Sequence[str] | None = None, checks: Sequence[Callable[[], Check]] = CHECKS) -> int:
    """``python -m ddpkit doctor [--json]``: print the checks; return 1 if any FAILs, else 0."""
    parser = argparse.ArgumentParser(
        prog="python -m ddpkit doctor",
        description="Check that this machine can run the course's chapters, and say how to fix what cannot.",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as a JSON list (for programs)")
    args = parser.parse_args(argv)
    results = run_checks(checks)
    failed = any(c.status == "FAIL" for c in results)
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in results], indent=2))
        return int(failed)
    print("ddpkit doctor: is this machine ready for the course?\n")
    print(format_report(results))
    print()
    print(summary(results) + (": fix the FAIL lines, then run this again." if failed else ": ready."))
    return int(failed)


# --------------------------------------------------------------------------- lab

SERVER_NOTE = (
    "JupyterLab is a server that keeps running in this terminal. Open the URL it prints below "
    "(with its token) in your browser; press Ctrl-C twice here to stop it."
)


def _default_notebooks() -> Path:
    """The course's ``notebooks/`` next to this package (an editable install), else in the current folder."""
    beside = Path(__file__).resolve().parent.parent / "notebooks"
    return beside if beside.is_dir() else Path.cwd() / "notebooks"


# What a course server on one's own machine does not need, each quieted with JupyterLab's own settings
# (a learner's own option of the same name wins): the kernel's "running over TCP without encryption"
# warning at every kernel start (local kernels talk over Unix sockets instead, where those work: POSIX,
# and a runtime folder short enough for a socket's path, 104 bytes on macOS), tornado's
# "websocket_ping_timeout (90000) cannot be longer than the websocket_ping_interval (30000)" at every
# notebook opened (jupyter_server's default timeout is 3 pings; equal to one ping changes nothing, tornado
# clamps it to that anyway), the "official Jupyter news?" popup, and the INFO log that buries the URL
# (jupyter_server prints the URL with its token at CRITICAL level, so it stays).
QUIET_SERVER = (
    '--ServerApp.tornado_settings={"ws_ping_timeout": 30000}',
    "--LabApp.news_url=None",
    "--ServerApp.log_level=WARN",
    "--LabApp.log_level=WARN",
)
_IPC_NAME = len("/kernel-00000000-0000-0000-0000-000000000000-ipc-5")


def quiet_server_options(runtime_dir: str | None = None) -> list[str]:
    """``QUIET_SERVER``, with ``--KernelManager.transport=ipc`` first where Unix sockets can be used.

    >>> quiet_server_options("/home/me/.local/share/jupyter/runtime")[0]
    '--KernelManager.transport=ipc'
    >>> quiet_server_options("/tmp/" + "x" * 60)[0]  # a socket path would pass 104 bytes: TCP, as by default
    '--ServerApp.tornado_settings={"ws_ping_timeout": 30000}'
    """
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    ipc = os.name == "posix" and len(os.fsencode(runtime_dir)) + _IPC_NAME < 104
    return ["--KernelManager.transport=ipc"] * ipc + list(QUIET_SERVER)


def lab_command(notebooks: str | os.PathLike, extra: Sequence[str] = (), root: bool | None = None) -> list[str]:
    """The command that starts JupyterLab on ``notebooks`` (``--allow-root`` added when running as root).

    It runs ``python -m jupyterlab`` with this interpreter, not ``jupyter lab``,
    which would run the first ``jupyter-lab`` on ``PATH``, maybe another environment's.
    The options of ``quiet_server_options()`` follow, except one the caller sets itself.

    >>> lab_command("notebooks", ["--port=8899", "--ServerApp.log_level=INFO"], root=True)[1:]  # doctest: +NORMALIZE_WHITESPACE
    ['-m', 'jupyterlab', 'notebooks', '--port=8899', '--ServerApp.log_level=INFO',
     '--KernelManager.transport=ipc', '--ServerApp.tornado_settings={"ws_ping_timeout": 30000}',
     '--LabApp.news_url=None', '--allow-root']
    """
    root = (hasattr(os, "geteuid") and os.geteuid() == 0) if root is None else root
    given = {arg.split("=", 1)[0].lstrip("-").replace("-", "_").split(".")[-1] for arg in extra}
    quiet = [opt for opt in quiet_server_options() if opt.split("=", 1)[0].split(".")[-1] not in given]
    command = [sys.executable, "-m", "jupyterlab", str(notebooks), *extra, *quiet]
    if root and "--allow-root" not in extra:
        # JupyterLab exits at once as root ("Running as root is not recommended") without it
        command.append("--allow-root")
    return command


def trust_notebooks(folder: str | os.PathLike) -> int:
    """Sign every notebook under ``folder`` for this user, as ``jupyter trust`` does; return how many.

    JupyterLab draws a notebook's saved widgets (an experiment's controls,
    before its cell has run) only in a *trusted* notebook, and a fresh copy of
    the course is trusted by nobody: untrusted, each experiment shows as
    ``VBox(children=...`` text until its cell runs. The signatures go to the
    user's Jupyter data dir (``JUPYTER_DATA_DIR``), not into the notebooks.
    """
    import nbformat
    from nbformat.sign import NotebookNotary

    notary = NotebookNotary()
    count = 0
    try:
        for path in sorted(Path(folder).rglob("*.ipynb")):
            if ".ipynb_checkpoints" in path.parts:
                continue
            nb = nbformat.read(path, as_version=4)
            if not notary.check_signature(nb):
                notary.sign(nb)
            count += 1
    finally:
        notary.store.close()
    return count


def lab_main(argv: Sequence[str] | None = None, checks: Sequence[Callable[[], Check]] = CHECKS) -> int:
    """``python -m ddpkit lab [--notebooks DIR] [--dry-run] [jupyter lab args...]``: doctor, then JupyterLab.

    Runs the checks (short report; WARNs are shown and do not stop it, a FAIL
    stops it with the fixes), then replaces this process with JupyterLab.
    """
    parser = argparse.ArgumentParser(
        prog="python -m ddpkit lab",
        description="Check this machine (python -m ddpkit doctor), then open the course's notebooks in JupyterLab. "
        "Other arguments go to `jupyter lab` (e.g. --port=8899 --no-browser).",
        allow_abbrev=False,
    )
    parser.add_argument("--notebooks", default=None, help="folder to open (default: the course's notebooks/)")
    parser.add_argument("--dry-run", action="store_true", help="run the checks and print the command, but start nothing")
    args, extra = parser.parse_known_args(argv)
    notebooks = Path(args.notebooks) if args.notebooks else _default_notebooks()
    if not notebooks.is_dir():
        print(f"No notebooks folder at {notebooks}: run this from the course folder, or pass --notebooks DIR.",
              file=sys.stderr)
        return 1
    results = run_checks(checks)
    if any(c.status == "FAIL" for c in results):
        print(format_report(results))
        print(f"\n{summary(results)}: fix the FAIL lines above, then run `python -m ddpkit lab` again.")
        return 1
    warnings = [c for c in results if c.status == "WARN"]
    print(f"{summary(results)}" + (" (details: python -m ddpkit doctor)" if warnings else ""))
    for c in warnings:
        print(textwrap.fill(f"WARN {c.name}: {c.found}. {c.fix}", subsequent_indent="    ", width=100))
    command = lab_command(notebooks, [a for a in extra if a != "--"])
    if not args.dry_run:
        count = trust_notebooks(notebooks)
        print(f"Trusted the course's {count} notebooks (so their saved experiment controls show before a cell runs).")
    print()
    print(textwrap.fill(SERVER_NOTE, width=100))
    print("$ " + shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    if os.name != "posix":  # no exec on Windows: run it as a child
        import subprocess

        return subprocess.call(command)
    sys.stderr.flush()
    os.execv(command[0], command)
