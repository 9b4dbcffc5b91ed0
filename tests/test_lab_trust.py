"""``python -m ddpkit lab`` trusts the course's notebooks, so JupyterLab draws their saved widgets.

(Apart from tests/test_doctor.py because nbformat's notary swaps a descriptor of its own the first
time it is used in a process, which that file's per-test leak check would count; here the check is
made around ``trust_notebooks`` itself, after a first use.)
"""

from __future__ import annotations

import nbformat
import psutil
from nbformat.sign import NotebookNotary

from ddpkit import _doctor


def _signed(path) -> bool:
    notary = NotebookNotary()
    try:
        return notary.check_signature(nbformat.read(path, as_version=4))
    finally:
        notary.close()


def test_lab_trusts_the_notebooks_so_saved_widgets_show(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))  # the signature db, not the user's
    folder = tmp_path / "nb"
    (folder / "solutions").mkdir(parents=True)
    paths = [folder / "a.ipynb", folder / "solutions" / "b.ipynb"]
    for path in paths:
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    assert not any(_signed(p) for p in paths)
    fds = psutil.Process().num_fds()
    assert _doctor.trust_notebooks(folder) == 2
    assert psutil.Process().num_fds() == fds  # the signature database is closed again
    assert all(_signed(p) for p in paths)
    assert _doctor.trust_notebooks(folder) == 2  # already trusted: nothing changes


CHAPTERS = ("01_env_ranks.ipynb", "04_ddp.ipynb", "09_sharding.ipynb")
# what each kernel runs: its chapter's first code cell (imports, the version check), then 2 real ranks
LAUNCH = """
def hello():
    import torch, torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())
print("ranks:", ddpkit.launch(hello, 2))
"""


def test_a_session_that_opens_three_chapters_shows_the_summary_the_url_and_nothing_alarming(tmp_path):
    """`python -m ddpkit lab`, as a learner runs it: three chapters opened, each kernel runs the chapter's first cell
    and 2 real ranks. The terminal must read: the doctor's summary, the trust line, the server note, the command,
    JupyterLab's URL; then nothing but its stop line (issue 26).

    Without ``QUIET_SERVER`` the same steps log "Kernel is running over TCP without encryption" (each kernel,
    at its start) and "The websocket_ping_timeout (90000) cannot be longer than the websocket_ping_interval
    (30000)" (tornado, at a kernel's websocket), INFO lines at every kernel start, and the page asks about news.
    """
    import asyncio
    import json
    import os
    import re
    import signal
    import socket
    import subprocess
    import shutil
    import sys
    import tempfile
    import time
    from pathlib import Path
    import urllib.request
    import uuid

    import pytest

    pytest.importorskip("jupyterlab")
    from tornado.websocket import websocket_connect

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("config", "data"):
        (tmp_path / name).mkdir()
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: the kernel's Unix sockets live here
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(runtime), "PYTHONWARNINGS": ""}
    token = None  # read from the URL the terminal shows, as a learner copies it
    assert _doctor.quiet_server_options(str(runtime))[0] == "--KernelManager.transport=ipc"
    command = [sys.executable, "-m", "ddpkit", "lab", "--notebooks", str(notebooks), "--no-browser",
               "--ip=127.0.0.1", f"--port={port}", "--ServerApp.terminals_enabled=False"]
    log = tmp_path / "terminal.txt"
    base = f"http://127.0.0.1:{port}"

    def api(path, data=None, method=None):
        request = urllib.request.Request(f"{base}/{path}", data=data, method=method,
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.read().decode()

    async def execute(kernel, code):
        ws = await websocket_connect(f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?session_id=t&token={token}")
        header = {"msg_id": uuid.uuid4().hex, "username": "t", "session": "t", "msg_type": "execute_request",
                  "version": "5.3"}
        ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                     "content": {"code": code, "silent": False}, "buffers": []}))
        shown = []
        try:
            while True:
                message = json.loads(await asyncio.wait_for(ws.read_message(), 120))
                if message.get("parent_header", {}).get("msg_id") != header["msg_id"]:
                    continue
                kind, content = message.get("msg_type"), message.get("content", {})
                if kind == "stream":
                    shown.append(content["text"])
                elif kind == "error":
                    shown.append(f"{content['ename']}: {content['evalue']}")
                elif kind == "status" and content.get("execution_state") == "idle":
                    return "".join(shown)
        finally:
            ws.close()

    with open(log, "wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while token is None:
            shown_url = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)", log.read_text())
            if shown_url:
                token = shown_url.group(1)
            else:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        api("api/status")
        for chapter in CHAPTERS:
            first = next("".join(c["source"]) for c in json.loads((notebooks / chapter).read_text())["cells"]
                         if c["cell_type"] == "code")
            session = json.loads(api("api/sessions", data=json.dumps(
                {"path": chapter, "type": "notebook", "name": chapter, "kernel": {"name": "python3"}}).encode()))
            shown = asyncio.run(execute(session["kernel"]["id"], first + LAUNCH))
            assert "ranks: [2, 2]" in shown and "Error" not in shown, f"{chapter}: {shown[-2000:]}"
        assert '"news": {"disabled": true}' in api(f"lab?token={token}")
        for session in json.loads(api("api/sessions")):
            api(f"api/sessions/{session['id']}", method="DELETE")
    finally:
        server.send_signal(signal.SIGINT)  # what a learner does: Ctrl-C (twice; the second one confirms)
        time.sleep(0.5)
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("doctor: ") and " FAIL" in lines[0], text[:2000]
    url = next((i for i, line in enumerate(lines) if f"http://127.0.0.1:{port}/lab?token=" in line), None)
    assert url is not None and url < 12, f"the URL is line {url} of the terminal:\n{text[:3000]}"
    expected = re.compile(
        r"^(doctor: .*|Trusted the course's \d+ notebooks .*|JupyterLab is a server .*|token\) in your browser.*"
        r"|\$ .*|\[C [\d\- :.]+ ServerApp\] ?(received signal 2, stopping|Shutting down .*)?|\s+To access the server.*"
        r"|\s+file:///.*|\s+Or copy and paste .*|\s+http://127\.0\.0\.1:\d+/lab\?token=\w+|Shutdown this Jupyter server.*"
        r"|Interrupted\.\.\.)$")
    alarming = [line for line in lines if not expected.match(line)]
    assert not alarming, f"the terminal shows more than the summary, the URL and the stop lines: {alarming[:10]}\n" \
                         f"whole terminal:\n{text[-4000:]}"
    assert not list(runtime.glob("kernel-*")), "the kernel's sockets and files are removed"
    shutil.rmtree(runtime)
