"""Which collective did the ranks disagree on? A per-rank diff of PyTorch's flight recorder.

In code that is still changing, a hung job is most often a *desync*: the
ranks did not call the same collectives in the same order. (On a GPU cluster
a hang can also be every rank inside the same collective, waiting for a slow
network, a failing link or a straggler: the records then agree.) Rank 0 waits in a broadcast that rank 1 never
calls because rank 1 is waiting in an all_gather. Every rank looks innocent on
its own; only a comparison across ranks shows the bug.

PyTorch's *flight recorder* keeps, in each process, a ring buffer of the last
collectives its process groups ran: the operation, the tensors' shapes and
dtypes, the process group, a sequence number within that group, and the
Python stack that called it. In PyTorch 2.13 it is on by default with room for
2000 entries (``TORCH_FR_BUFFER_SIZE``; ``0`` turns it off; read when the
recorder is first used in a process, see ``FlightRecorder.hpp``), for gloo as
well as nccl. ``torch._C._distributed_c10d._dump_fr_trace()`` (private)
returns it as a pickle. On nccl a watchdog dumps it on a timeout and
``torch.distributed.flight_recorder``'s ``fr_trace`` tool compares the dumps;
on gloo there is no watchdog, every entry stays ``"scheduled"``, and the tool
fails on gloo dumps. Two facts on gloo in 2.13 matter here: point-to-point
``send``/``recv`` are not recorded, and ``reduce_scatter`` is recorded as the
all-reduces gloo runs for it. With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` each
group is wrapped in a checking group whose own collectives are recorded too;
the recorder then files them, and your own collectives on the wrapped group,
under the group name ``""`` (chapter 11, section 6).

This module does the comparison a learner needs, and nothing more:

* :func:`flight_record`, called in a rank, returns its recorded collectives
  as :class:`Collective` records (picklable, so a rank can return them from
  :func:`ddpkit.launch`), each with the line of *your* code that called it;
* :func:`first_mismatch` lines the ranks' records up by process group and
  sequence number and returns the first collective they disagree on (a
  different operation, shape or dtype, or one that some rank never called) as
  a :class:`Mismatch` that prints each rank's call side by side.

Chapter 11 uses it to find a hang's cause in seconds instead of minutes.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import pickle
from typing import Sequence

# Frames from these directories are machinery (torch, ddpkit, the standard library's
# multiprocessing and threading): the first frame outside them is the caller's own line.
_MACHINERY = tuple(
    os.path.dirname(path) + os.sep
    for path in (__file__, os.__file__)
) + ("<frozen ",)


def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__) + os.sep


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective as the flight recorder saw it in one rank.

    ``group`` is the process group's name (``"0"`` for the default group,
    ``"1"``, ``"2"``... for groups created later, in the order they were
    created) and ``group_desc`` its description (``"default_pg"``); ``seq``
    numbers the collectives of that group from 1, the same on every rank
    while the ranks agree. ``op`` is the operation without the backend
    (``"all_reduce"``), ``input_sizes``/``output_sizes`` one shape per tensor,
    ``input_dtypes`` PyTorch's names (``"Float"``), ``where`` the line that
    called it (``"train, line 12: dist.all_reduce(t)"``, without the source
    text when it is not available), ``state`` the recorder's state
    (``"scheduled"`` on gloo, always), ``group_ranks`` the global ranks of
    the group (empty when unknown, as under ``DETAIL``'s wrapper).

    >>> c = Collective("0", "default_pg", 3, "all_reduce", ((4,),), ((4,),), ("Float",), "work, line 5", "scheduled")
    >>> str(c)
    'all_reduce [4] Float at work, line 5'
    """

    group: str
    group_desc: str
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    where: str
    state: str
    group_ranks: tuple[int, ...] = ()

    def signature(self) -> tuple:
        """What every rank must pass alike: the operation, and the shapes and dtypes every rank gives.

        A scatter's input exists on its source rank only, so its outputs are
        compared; an all_to_all may legitimately split unevenly, so only its
        name is.

        >>> Collective("0", "", 1, "scatter", (), ((4,),), (), "", "").signature()
        ('scatter', ((4,),), ())
        """
        if "all_to_all" in self.op or "alltoall" in self.op:
            return (self.op,)
        if self.op == "scatter":
            return (self.op, self.output_sizes, ())
        return (self.op, self.input_sizes, self.input_dtypes)

    def __str__(self) -> str:
        sizes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in (self.input_sizes or self.output_sizes))
        parts = [self.op, sizes, "/".join(dict.fromkeys(self.input_dtypes))]
        return " ".join(p for p in parts if p) + (f" at {self.where}" if self.where else "")


def _where(frames: list[dict], machinery: tuple[str, ...]) -> str:
    for frame in frames:  # innermost first
        filename = frame.get("filename", "")
        if filename.startswith(machinery):
            continue
        line = frame.get("line", 0)
        text = linecache.getline(filename, line).strip() if filename else ""
        return f"{frame.get('name', '?')}, line {line}" + (f": {text}" if text else "")
    return ""


def _group_ranks() -> dict[str, tuple[int, ...]]:
    """Each process group's name -> its global ranks, for the groups this process knows."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    from torch.distributed.distributed_c10d import _world

    found = {}
    for group, name in list(_world.pg_names.items()):
        try:
            found[str(name)] = tuple(dist.get_process_group_ranks(group))
        except Exception:  # a group this rank is not part of, or one already destroyed
            continue
    return found


def flight_record() -> list[Collective]:
    """This rank's collectives, oldest first, as PyTorch's flight recorder recorded them.

    Call it in a rank, for instance in an ``except`` after a collective timed
    out, and return the list from the rank's function: :func:`first_mismatch`
    compares the ranks' lists. Point-to-point ``send``/``recv`` are left out
    (gloo does not record them). Raises ``RuntimeError`` when the recorder is
    off (``TORCH_FR_BUFFER_SIZE=0``) or nothing was recorded.

    >>> import ddpkit, torch, torch.distributed as dist
    >>> def work():
    ...     dist.all_reduce(torch.ones(4))
    ...     return ddpkit.flight_record()
    >>> [[str(c).split(" at ")[0] for c in rank] for rank in ddpkit.launch(work, world_size=2)]
    [['all_reduce [4] Float'], ['all_reduce [4] Float']]
    """
    import torch

    size = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", ""))
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    entries = dump.get("entries", [])
    if not entries:
        why = (f"TORCH_FR_BUFFER_SIZE={size} turns it off" if size.strip() in ("0", "-1")
               else "no collective has run in this process yet")
        raise RuntimeError(
            f"the flight recorder has no entries ({why}). Run the collectives first, and leave "
            "TORCH_FR_BUFFER_SIZE unset (2000 entries by default) or give it a positive value before the "
            "process group is created, e.g. ddpkit.launch(fn, env={'TORCH_FR_BUFFER_SIZE': '2000'})."
        )
    machinery = _MACHINERY + (_torch_dir(),)
    members = _group_ranks()
    return [
        Collective(
            group=str(e["process_group"][0]),
            group_desc=str(e["process_group"][1]),
            seq=int(e["collective_seq_id"]),
            op=e["profiling_name"].split(":", 1)[-1],
            input_sizes=tuple(tuple(s) for s in e.get("input_sizes", [])),
            output_sizes=tuple(tuple(s) for s in e.get("output_sizes", [])),
            input_dtypes=tuple(e.get("input_dtypes", [])),
            where=_where(e.get("frames", []), machinery),
            state=str(e.get("state", "")),
            group_ranks=members.get(str(e["process_group"][0]), ()),
        )
        for e in entries
        if not e.get("is_p2p")
    ]


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first collective the ranks disagree on: collective ``seq`` of process group ``group``.

    ``calls`` maps each rank that used the group to its call there, ``None``
    for a rank that never made it; ``reason`` says what differs.

    >>> a = Collective("0", "default_pg", 2, "broadcast", ((4,),), ((4,),), ("Float",), "work, line 9", "scheduled")
    >>> print(Mismatch("0", "default_pg", 2, "rank 1 never called it", {0: a, 1: None}))
    collective #2 of process group 0 (default_pg): rank 1 never called it
      rank 0: broadcast [4] Float at work, line 9
      rank 1: (no call: its last collective in this group came before)
    """

    group: str
    group_desc: str
    seq: int
    reason: str
    calls: dict

    def __str__(self) -> str:
        desc = f" ({self.group_desc})" if self.group_desc and self.group_desc != "undefined" else ""
        lines = [f"collective #{self.seq} of process group {self.group}{desc}: {self.reason}"]
        for rank, call in sorted(self.calls.items()):
            lines.append(f"  rank {rank}: " + (str(call) if call is not None
                                                else "(no call: its last collective in this group came before)"))
        return "\n".join(lines)


def _reason(calls: dict) -> str:
    missing = [r for r, c in calls.items() if c is None]
    if missing:
        who = ", ".join(map(str, missing))
        return f"rank{'s' if len(missing) > 1 else ''} {who} never called it"
    present = list(calls.values())
    for what, key in (("operations", lambda c: c.op), ("shapes", lambda c: c.signature()[1:2]),
                      ("dtypes", lambda c: c.signature()[2:])):
        if len({key(c) for c in present}) > 1:
            return f"the ranks called different {what}"
    return "the ranks' calls differ"


def first_mismatch(records: Sequence[Sequence[Collective]]) -> Mismatch | None:
    """The first collective the ranks disagree on, or ``None`` when they all agree.

    ``records[r]`` is rank r's :func:`flight_record`. Collectives are matched
    by process group and sequence number, from the first number all of the
    group's ranks still hold (the recorder is a ring buffer). A group's ranks
    are its members (``Collective.group_ranks``), so a member that never used
    the group at all is reported too; where membership is unknown, the ranks
    that recorded something in the group. Across groups, the mismatch
    recorded earliest (by its place in the ranks' records) is reported.

    >>> def call(seq, op, shape=(4,)):
    ...     return Collective("0", "default_pg", seq, op, (shape,), (shape,), ("Float",), "", "scheduled")
    >>> rank0 = [call(1, "all_reduce"), call(2, "all_reduce", (5,))]
    >>> rank1 = [call(1, "all_reduce"), call(2, "all_reduce", (4,))]
    >>> print(first_mismatch([rank0, rank1]))
    collective #2 of process group 0 (default_pg): the ranks called different shapes
      rank 0: all_reduce [5] Float
      rank 1: all_reduce [4] Float
    >>> first_mismatch([rank1, rank1]) is None
    True
    >>> first_mismatch([[call(1, "barrier"), call(3, "barrier")]] * 2) is None   # #2 recorded by no rank
    True
    >>> evaluate = Collective("1", "", 1, "all_reduce", ((1,),), ((1,),), ("Float",), "", "", group_ranks=(0, 1))
    >>> print(first_mismatch([[call(1, "barrier"), evaluate], [call(1, "barrier")]]).reason)
    rank 1 never called it
    """
    groups: dict[str, dict[int, dict[int, Collective]]] = {}
    position: dict[tuple[str, int, int], int] = {}
    members: dict[str, set[int]] = {}
    for rank, record in enumerate(records):
        for index, call in enumerate(record):
            groups.setdefault(call.group, {}).setdefault(rank, {})[call.seq] = call
            position[(call.group, call.seq, rank)] = index
            members.setdefault(call.group, set()).update(r for r in call.group_ranks if r < len(records))
    found = []
    for group, by_rank in groups.items():
        for rank in members.get(group, ()):
            by_rank.setdefault(rank, {})  # a member that recorded nothing in this group
        held = [min(seqs) for seqs in by_rank.values() if seqs]
        start = max(held)
        end = max(max(seqs) for seqs in by_rank.values() if seqs)
        for seq in range(start, end + 1):
            calls = {rank: by_rank[rank].get(seq) for rank in sorted(by_rank)}
            present = [c for c in calls.values() if c is not None]
            if not present:  # a number no rank recorded (e.g. DETAIL's helper group: its send/recv are not kept)
                continue
            if len(present) < len(calls) or len({c.signature() for c in present}) > 1:
                order = min(position[(group, seq, r)] for r, c in calls.items() if c is not None)
                found.append((order, Mismatch(group, present[0].group_desc, seq, _reason(calls), calls)))
                break
    return min(found, key=lambda pair: pair[0])[1] if found else None
