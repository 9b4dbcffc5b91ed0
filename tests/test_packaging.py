"""The project's promises about itself: README commands, CI entry point, pip and conda requirements agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch-cpu": "torch"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _split(requirement: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", requirement.strip()).groups()
    return name.lower(), spec.replace(" ", "")


def test_environment_yml_declares_the_same_packages_as_pyproject():
    project = _pyproject()["project"]
    pip = dict(_split(r) for r in project["dependencies"])
    for extra in ("lab", "test"):
        pip.update(_split(r) for r in project["optional-dependencies"][extra])
    conda = {}
    dependencies = (ROOT / "environment.yml").read_text().split("dependencies:")[1]
    for line in dependencies.splitlines():
        m = re.match(r"^  - ([A-Za-z0-9_.\-]+[^#:]*)$", line)
        if m and m.group(1).split()[0] not in ("pip", "python>=3.10"):
            name, spec = _split(m.group(1))
            conda[CONDA_TO_PIP.get(name, name)] = spec
    assert conda == pip
    assert "python>=3.10" in (ROOT / "environment.yml").read_text()
    assert project["requires-python"] == ">=3.10"


def test_torch_is_a_range_not_a_pin():
    deps = dict(_split(r) for r in _pyproject()["project"]["dependencies"])
    assert deps["torch"].startswith(">=")


def test_readme_first_screen_has_exactly_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_screen = readme.split("## ")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", first_screen, flags=re.S)
    assert len(commands) == 2, commands
    lab, test = commands
    assert "-m ddpkit lab" in lab and "pytest" in test
    for command in commands:
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines()


def test_every_notebook_is_listed_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"(notebooks/{nb.name})" in readme, nb.name
