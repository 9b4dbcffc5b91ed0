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


def test_the_course_server_is_quiet_and_its_kernels_run(tmp_path):
    """A kernel started and used through the server `python -m ddpkit lab` starts logs no false alarm.

    Without ``QUIET_SERVER`` the same steps log "Kernel is running over TCP without encryption" (the
    kernel, at its start) and "The websocket_ping_timeout (90000) cannot be longer than the
    websocket_ping_interval (30000)" (tornado, at the kernel's websocket), and the page asks about news.
    """
    import asyncio
    import json
    import os
    import secrets
    import socket
    import subprocess
    import shutil
    import tempfile
    import time
    from pathlib import Path
    from unittest import mock
    import urllib.request
    import uuid

    import pytest

    pytest.importorskip("jupyterlab")
    from tornado.websocket import websocket_connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    for name in ("config", "data"):
        (tmp_path / name).mkdir()
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: the kernel's Unix sockets live here
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(runtime)}
    assert _doctor.quiet_server_options(str(runtime))[0] == "--KernelManager.transport=ipc"
    with mock.patch.dict(os.environ, {"JUPYTER_RUNTIME_DIR": str(runtime)}):
        command = _doctor.lab_command(tmp_path, ["--no-browser", "--ip=127.0.0.1", f"--port={port}",
                                                 f"--IdentityProvider.token={token}", "--ServerApp.terminals_enabled=False"])
    log = tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"

    def api(path, data=None):
        request = urllib.request.Request(f"{base}/{path}", data=data, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read().decode()

    async def execute(kernel):
        ws = await websocket_connect(f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?session_id=t&token={token}")
        header = {"msg_id": uuid.uuid4().hex, "username": "t", "session": "t", "msg_type": "execute_request",
                  "version": "5.3"}
        ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                     "content": {"code": "print(6 * 7)", "silent": False}, "buffers": []}))
        while True:
            message = json.loads(await asyncio.wait_for(ws.read_message(), 60))
            if message.get("msg_type") == "stream":
                ws.close()
                return message["content"]["text"]

    with open(log, "wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                api("api/status")
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        try:
            kernel = json.loads(api("api/kernels", data=json.dumps({"name": "python3"}).encode()))["id"]
        except OSError:
            raise AssertionError(log.read_text()[-3000:])
        assert asyncio.run(execute(kernel)) == "42\n"
        assert '"news": {"disabled": true}' in api(f"lab?token={token}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    for alarm in ("without encryption", "websocket_ping_timeout", "[I "):
        assert alarm not in text, f"{alarm!r} in the server's log:\n{text[-3000:]}"
    assert not list(runtime.glob("kernel-*")), "the kernel's sockets and files are removed"
    shutil.rmtree(runtime)
