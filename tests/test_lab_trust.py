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
