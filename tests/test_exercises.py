"""Exercise checks (issue 21): each check passes its worked solution, reads an untouched attempt as
"not attempted", and fails the usual wrong answer with the message a learner needs, on real ranks.

The planted mistakes run through instructor mode (``python -m ddpkit check``) on a copy of the chapter
whose attempt cell holds the mistake, so the tests also cover the way an instructor checks a class.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpkit
import ddpkit.exercises as ex
from ddpkit.exercises import _notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS_WITH_CHECKS = sorted({e.chapter for e in ex.exercises()})

# The usual mistake per exercise: the attempt cell's source, and words the answer must contain.
PLANTED = {
    "05.1": ('''
def padding_duplicates(n, world_size, epoch):        # the unshuffled guess: always the first items
    total = -(-n // world_size) * world_size
    return list(range(n))[: total - n]
''', ["smallest case that fails: n=3, world_size=4, epoch=0", "expected: [2]", "got:      [0]", "section 1"]),
    "05.2": ('''
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler
def mean_test_loss(model, x, y):                     # padded shares, and the mean of the ranks' means
    idx = list(DistributedSampler(range(len(y)), shuffle=False))
    with torch.no_grad():
        loss = F.cross_entropy(model(x[idx]), y[idx]).double().reshape(1)
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()
''', ["world_size=2 (357 test images", "count each test image once", "section 4"]),
    "05.4": ('''
import math, torch, torch.distributed as dist
class DistributedLengthGroupedSampler:               # seeded by rank: the ranks cut different orders
    def __init__(self, lengths, chunk_per_rank=100, num_replicas=None, rank=None, seed=0):
        self.lengths, self.seed, self.epoch = list(lengths), seed, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.chunk, self.total = chunk_per_rank * self.world, math.ceil(len(self.lengths) / self.world) * self.world
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch + self.rank)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        order = (order * self.total)[: self.total]
        grouped = [i for s in range(0, self.total, self.chunk) for i in sorted(order[s:s + self.chunk], key=self.lengths.__getitem__)]
        return iter(grouped[self.rank::self.world])
''', ["samples covered and duplicated", "the same generator seed on every rank"]),
}


def _with_attempts(chapter: Path, attempts: dict[str, str], tmp_path: Path) -> Path:
    """A copy of ``chapter`` whose attempt cells for the given exercises hold the given source."""
    nb = json.loads(chapter.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for before, cell in zip(code, code[1:]):
        match = _notebook._CHECK.search("".join(cell["source"]))
        if match and match.group(1) in attempts:
            before["source"] = attempts[match.group(1)]
    path = tmp_path / chapter.name
    path.write_text(json.dumps(nb))
    return path


def test_the_public_surface_is_pinned():
    assert ex.__all__ == sorted(ex.__all__)
    assert set(ex.__all__) == {"Exercise", "Result", "Wrong", "attempt_cells", "check", "check_notebook",
                               "exercises", "reveal", "untouched", "worked_answer"}
    assert ddpkit.exercises is ex


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_CHECKS)
def test_each_checked_exercise_has_its_attempt_and_check_cell_in_the_chapter(chapter):
    keys = [e.key for e in ex.exercises(chapter)]
    assert len(keys) >= 3, f"chapter {chapter}: at least three checked exercises"
    assert [k for k, _, _ in _notebook.attempt_cells(NOTEBOOKS / f"{chapter}.ipynb")] == keys
    assert {k for k, _, _ in _notebook.attempt_cells(NOTEBOOKS / "solutions" / f"{chapter}.ipynb")} == set(keys)


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_CHECKS)
def test_the_chapter_as_shipped_reads_not_attempted_and_the_solutions_pass(chapter):
    shipped = _notebook.check_notebook(NOTEBOOKS / f"{chapter}.ipynb")
    assert [r.status for r in shipped] == ["not attempted"] * len(shipped), [str(r) for r in shipped]
    solved = _notebook.check_notebook(NOTEBOOKS / "solutions" / f"{chapter}.ipynb")
    assert [r.status for r in solved] == ["right"] * len(solved), [str(r) for r in solved]


@pytest.mark.parametrize("key", sorted(PLANTED))
def test_the_usual_mistake_fails_with_what_a_learner_needs(key, tmp_path):
    source, words = PLANTED[key]
    chapter = NOTEBOOKS / f"{ex.exercises(key.split('.')[0])[0].chapter}.ipynb"
    found = {r.exercise: r for r in _notebook.check_notebook(_with_attempts(chapter, {key: source}, tmp_path))}
    assert found[key].status == "wrong", str(found[key])
    for word in words:
        assert word in found[key].message, (word, found[key].message)
    assert "solution" not in found[key].message.lower()


def test_a_crashing_rank_gets_the_launchers_report_root_cause_first():
    def mean_test_loss(model, x, y):
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("rank 1 gave up")
        dist.barrier()

    result = ex.check("05.2", mean_test_loss)
    assert result.status == "wrong"
    assert "did not finish on the ranks" in result.message
    lines = result.message.splitlines()
    assert lines[1] == "rank 1 of 2 failed: ValueError: rank 1 gave up"              # the root cause, first
    cause = result.message.split("Root Cause", 1)[1]
    assert cause.index("rank 1 (local rank 1") < cause.index("rank 0 (local rank 0")


def test_a_hanging_collective_ends_at_the_checks_timeout():
    def mean_test_loss(model, x, y):
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 0:          # rank 1 never joins this all_reduce
            dist.all_reduce(torch.ones(1))
        return 0.0

    start = time.monotonic()
    result = ex.check("05.2", mean_test_loss)
    assert result.status == "wrong" and "did not finish" in result.message, result.message
    assert time.monotonic() - start < 60


def test_untouched_attempts_are_recognised_and_edited_ones_are_not():
    def body_raises(n):
        """A docstring does not count as an attempt."""
        raise NotImplementedError("your code here")

    def body_ellipsis(n):
        ...

    class Untouched:
        def __init__(self):
            raise NotImplementedError

        def __iter__(self):
            ...

    def started(n):
        x = n + 1
        raise NotImplementedError

    assert all(ex.untouched(a) for a in (body_raises, body_ellipsis, Untouched, ...))
    assert not any(ex.untouched(a) for a in (started, len, 3, lambda n: n))
    assert "not attempted yet" in ex.check("05.1", body_raises).message
    with pytest.raises(KeyError, match="the checked exercises are 05.1"):
        ex.check("99.1", started)


def test_instructor_mode_prints_one_line_per_exercise_and_an_exit_status(tmp_path):
    solved = {k: a for k, a, _ in _notebook.attempt_cells(NOTEBOOKS / "solutions" / "05_samplers.ipynb")}
    attempts = {"05.1": solved["05.1"], "05.2": PLANTED["05.2"][0]}          # 05.4 left untouched
    path = _with_attempts(NOTEBOOKS / "05_samplers.ipynb", attempts, tmp_path)
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    elapsed = time.monotonic() - start
    lines = run.stdout.splitlines()
    assert lines[0] == f"{path}: 1 of 3 checked exercises right", run.stdout + run.stderr
    assert lines[1] == "  05.1  done"
    assert lines[2].startswith("  05.2  wrong: ") and "smallest case that fails" in lines[2]
    assert lines[3] == "  05.4  not attempted"
    assert run.returncode == 1
    assert elapsed < 60, f"instructor mode took {elapsed:.0f} s"
    as_json = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(path), "--json"], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    report = json.loads(as_json.stdout)[str(path)]
    assert [(r["exercise"], r["status"]) for r in report] == [("05.1", "right"), ("05.2", "wrong"),
                                                               ("05.4", "not attempted")]


def test_instructor_mode_says_what_to_do_with_bad_input(tmp_path):
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check", str(tmp_path / "missing.ipynb")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no such notebook" in run.stderr
    run = subprocess.run([sys.executable, "-m", "ddpkit", "check"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "usage: python -m ddpkit check" in run.stderr


def test_reveal_shows_the_worked_answer_from_the_solutions_notebook():
    box = ex.reveal("05.5")
    text_box, button, shown = box.children
    assert shown.outputs == ()
    button.click()
    text = shown.outputs[0]["data"]["text/markdown"]
    assert "seed + rank" in text and "```python" in text and "solutions/05_samplers.ipynb" in text
