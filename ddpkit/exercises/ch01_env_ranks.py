"""Checks for chapter 01's exercises (``notebooks/01_env_ranks.ipynb``).

* 01.1 ``predict_ranks(world_size, nnodes)``: the ``(RANK, LOCAL_RANK, GROUP_RANK)`` of every process, in
  rank order, predicted without launching, and a ``ValueError`` for a world that machines cannot share
  evenly; against what real ranks read, on 1 machine x 1, 1 x 4, 2 x 2, 3 x 2 and 2 x 4 processes;
* 01.2 ``log_epoch_own_file(log_dir)``: every rank appends its line to a log file of its own, on 1 x 2,
  2 x 2 and 3 x 2 processes sharing one directory (as nodes share a file system), two epochs each;
* 01.3 ``save_then_load(model, ckpt_dir)``: rank 0 saves, every rank returns the state dict it loads, on 1
  and 2 ranks with rank 0 on time, then on 2 and 4 ranks with rank 0 late by 1.5 s (as a big checkpoint
  makes it), against rank 0's weights; and every rank must return within 1 s of rank 0 (it waits for
  rank 0, not for a fixed time: a fixed sleep is too short when rank 0 is late, too long when on time).

Exercises 4 and 5 ask what happens and why: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import os
import re
import tempfile
import time

from .. import _launch
from ._core import Wrong, exercise

CHAPTER = "01_env_ranks"

# --------------------------------------------------------------------------- 01.1


def _read_ranks():
    """On each rank: what the launcher's variables say."""
    return tuple(int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK"))


@exercise("01.1", CHAPTER, "predict every process's RANK, LOCAL_RANK and GROUP_RANK",
          "section 3 (2 machines x 4 processes)")
def check_predict_ranks(predict_ranks) -> str:
    shapes = [(1, 1), (4, 1), (4, 2), (6, 3), (8, 2)]
    for world, nnodes in shapes:
        expected = [tuple(t) for t in _launch.launch(_read_ranks, world, nnodes=nnodes,
                                                     init_process_group=False, timeout=20)]
        got = predict_ranks(world, nnodes)
        got = [tuple(t) for t in got] if isinstance(got, (list, tuple)) else got
        if got != expected:
            raise Wrong(f"world_size={world}, nnodes={nnodes}", expected, got,
                        "machines fill one after the other, and LOCAL_RANK restarts at 0 on each machine")
    for world, nnodes in [(6, 4), (3, 2)]:
        try:
            got = predict_ranks(world, nnodes)
        except ValueError:
            continue
        raise Wrong(f"world_size={world}, nnodes={nnodes}", "ValueError (ddpkit.launch refuses this shape)",
                    got, "every machine runs the same number of processes")
    return ("your triples equal what real ranks read on 1 x 1, 1 x 4, 2 x 2, 3 x 2 and 2 x 4 processes, and "
            "you refused 6 processes on 4 machines and 3 on 2.")


# --------------------------------------------------------------------------- 01.2


def _log_two_epochs(log_epoch_own_file, log_dir):
    for _ in range(2):
        log_epoch_own_file(log_dir)


@exercise("01.2", CHAPTER, "a log file of its own for every rank",
          "section 3 (what must be unique in the whole job) and section 4 (logging)")
def check_own_log_file(log_epoch_own_file) -> str:
    for world, nnodes in [(2, 1), (4, 2), (6, 3)]:
        with tempfile.TemporaryDirectory() as log_dir:
            _launch.launch(_log_two_epochs, world, nnodes=nnodes, args=(log_epoch_own_file, log_dir),
                           init_process_group=False, timeout=20)
            writers = {}
            for name in sorted(os.listdir(log_dir)):
                with open(os.path.join(log_dir, name)) as f:
                    writers[name] = [int(m) for m in re.findall(r"written by rank (\d+)", f.read())]
        case = f"world_size={world}, nnodes={nnodes}, two epochs, one shared directory"
        if sorted(w for ranks in writers.values() for w in ranks) != sorted(list(range(world)) * 2):
            raise Wrong(case + ": the lines 'written by rank R'", f"two lines from each rank 0 to {world - 1}",
                        writers, "append one line per epoch, naming the rank that writes it")
        shared = {name: ranks for name, ranks in writers.items() if len(set(ranks)) != 1}
        if len(writers) != world or shared:
            raise Wrong(case, f"{world} files, each written by one rank", writers,
                        "a name must be unique in the whole job, not only on one machine")
    return ("on 1 x 2, 2 x 2 and 3 x 2 processes sharing one directory, every rank wrote its two lines into a "
            "file of its own.")


# --------------------------------------------------------------------------- 01.3


def _save_then_load_on_ranks(save_then_load, ckpt_dir, late_s):
    import torch

    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)                     # each rank its own weights, to tell whose file it loads
    model = torch.nn.Linear(4, 2)
    if rank == 0 and late_s:
        time.sleep(late_s)                      # a big checkpoint: rank 0 gets to the save late
    try:
        state = save_then_load(model, ckpt_dir)
    except FileNotFoundError:
        return "FileNotFoundError", time.monotonic()
    returned = time.monotonic()                 # one clock for every process of this machine
    weight = state.get("weight") if isinstance(state, dict) else None
    if not isinstance(weight, torch.Tensor):
        return f"not a state dict: {type(state).__name__}", returned
    return weight.detach().clone(), returned


@exercise("01.3", CHAPTER, "rank 0 saves, every rank loads rank 0's checkpoint",
          "section 4 (rank 0 saves, everyone passes a barrier)")
def check_save_then_load(save_then_load) -> str:
    import torch

    torch.manual_seed(0)
    rank0 = torch.nn.Linear(4, 2).weight.detach()
    for world, late_s in [(1, 0.0), (2, 0.0), (2, 1.5), (4, 1.5)]:
        with tempfile.TemporaryDirectory() as ckpt_dir:
            got = _launch.launch(_save_then_load_on_ranks, world, args=(save_then_load, ckpt_dir, late_s),
                                 timeout=20)
            files = sorted(os.listdir(ckpt_dir))
        case = f"world_size={world}, rank 0 {'late by %.1f s' % late_s if late_s else 'on time'}"
        loaded = ["rank 0's weights" if isinstance(w, torch.Tensor) and torch.equal(w, rank0)
                  else w if isinstance(w, str) else "other weights" for w, _ in got]
        if loaded != ["rank 0's weights"] * world:
            raise Wrong(case + ": what each rank loaded", ["rank 0's weights"] * world, loaded,
                        "a rank may read the file only once rank 0 has written it: make every rank "
                        "wait for that, however late rank 0 is")
        if len(files) != 1:
            raise Wrong(case + ": the checkpoint directory", "one file, written by rank 0", files,
                        "only the main process saves")
        after = [round(returned - got[0][1], 1) for _, returned in got]
        if max(after) > _WAIT_MARGIN_S:
            raise Wrong(case + ": when each rank returned, in seconds after rank 0 returned",
                        f"every rank within {_WAIT_MARGIN_S:g} s of rank 0 (they go on together once rank 0 has "
                        "saved)", after,
                        "a rank that sleeps a fixed time instead of waiting for rank 0 is too late when rank 0 is "
                        "on time, and too early when it is late: wait exactly as long as rank 0 takes")
    return ("on 1 and 2 ranks with rank 0 on time, and on 2 and 4 ranks with rank 0 1.5 s late, every rank "
            "loaded rank 0's weights from the one file rank 0 saved, and went on as soon as rank 0 had saved.")


#: How long after rank 0 another rank may return from 01.3's attempt: far above the skew of a barrier on a
#: loaded machine, far below rank 0's lateness (1.5 s), so that no fixed sleep passes both kinds of case.
_WAIT_MARGIN_S = 1.0
