"""Checks for chapter 02's exercises (``notebooks/02_init_methods.ipynb``).

* 02.1 ``init_tcp(addr, port, rank, world_size, timeout_s)``: a ``tcp://`` init with the rank and world size
  in the URL, on 1 and 3 ranks with no launcher variables left to fall back on, then 2 processes started
  for ``world_size=3`` (a missing rank), with ``timeout_s`` 1 and 3: both must fail after the timeout they
  are given (a fixed timeout of the attempt's own fits neither both), not after 30 minutes;
* 02.3 ``first_to_finish(store, rank)``: a "first to finish wins" race on a shared ``TCPStore``, on 1 and
  4 ranks that finish in a set order (the store's host first, last, in between), against that order; then
  4 ranks that finish at the same moment, on a store whose reads are slow (so a check-then-set lets every
  rank claim): all must agree on one winner;
* 02.4 ``group_store(store, group_name)``: the store a process group should use on a store shared with
  other groups, on 3 ranks: every rank reads every rank's key through its own group, and never another
  group's value.

Exercises 2, 5 and 6 ask what happens and why: the chapter offers a self-check
(:func:`ddpkit.exercises.reveal`) for them.
"""

from __future__ import annotations

import datetime
import os
import time

from .. import _launch
from .._errors import LaunchTimeoutError
from ._core import Wrong, exercise

CHAPTER = "02_init_methods"

# --------------------------------------------------------------------------- 02.1


def _tcp_on_ranks(init_tcp, world_size, timeout_s):
    """On each rank: call the attempt with this rank's values, then report what the group is."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        os.environ.pop(name, None)  # nothing left for an env:// init to read: the URL must carry it all
    start = time.perf_counter()
    try:
        init_tcp(addr, port, rank, world_size, timeout_s)
    except Exception as e:  # DistStoreError and friends: the missing-rank case expects one
        return "raised", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if not dist.is_initialized():
        return "no group", "", seconds
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    joined = (dist.get_rank(), dist.get_world_size(), dist.get_backend(), total.item())
    dist.destroy_process_group()
    return "joined", joined, seconds


@exercise("02.1", CHAPTER, "a tcp:// init with the rank and world size in the URL",
          "section 3 (init methods) and section 7 (a rank that never arrives)")
def check_init_tcp(init_tcp) -> str:
    for world in (1, 3):
        got = _launch.launch(_tcp_on_ranks, world, args=(init_tcp, world, 10), init_process_group=False, timeout=20)
        for rank, (kind, what, _) in enumerate(got):
            expected = (rank, world, "gloo", world * (world + 1) // 2)
            if kind != "joined":
                raise Wrong(f"world_size={world}, rank {rank} (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset)",
                            f"joined, as rank {rank} of {world}", f"{kind}: {what}" if what else kind,
                            "read nothing from the environment: the tcp:// URL carries the address, the port, "
                            "the rank and the world size (?rank=...&world_size=...), for the gloo backend")
            if what != expected:
                raise Wrong(f"world_size={world}, rank {rank}: (get_rank, get_world_size, get_backend, all_reduce "
                            "of rank + 1)", expected, what, "each rank passes its own rank, and the gloo backend")
    for timeout_s in _MISSING_RANK_TIMEOUTS:  # two timeouts: the wait must follow the one it is given
        case, limit = f"world_size=3 but 2 processes started, timeout_s={timeout_s}", timeout_s + 8
        try:
            got = _launch.launch(_tcp_on_ranks, 2, args=(init_tcp, 3, timeout_s), init_process_group=False,
                                 timeout=limit)
        except LaunchTimeoutError:
            raise Wrong(case, f"both ranks raise after about {timeout_s} s", f"still waiting after {limit} s",
                        "pass the timeout on to init_process_group: without one, gloo waits 30 minutes") from None
        messages = [what for _, what, _ in got]
        if [kind for kind, _, _ in got] != ["raised", "raised"] or not ("clients joined" in messages[0]
                                                                         and "wait timeout" in messages[1]):
            raise Wrong(case, ["DistStoreError: ... 2/3 clients joined", "DistStoreError: wait timeout ..."],
                        [f"{kind}: {what}" for kind, what, _ in got],
                        "a missing rank must make both ranks fail after the timeout, rank 0 (the store's host) "
                        "waiting for clients and rank 1 for rank 0's key")
        first, last = sorted(seconds for _, _, seconds in got)
        low, high = timeout_s - 0.3, timeout_s + _LATE_MARGIN_S  # the client raises right at the timeout
        if not (low <= first <= high and last <= high + 1):      # the host looks for clients once a second
            raise Wrong(case, f"both ranks raise after about {timeout_s} s (the first between {low:g} and "
                        f"{high:g} s)", f"the first after {first:.1f} s, the last after {last:.1f} s",
                        "use the timeout_s you are given, in seconds: not a timeout of your own choosing")
    shown = " and ".join(f"{t} s" for t in _MISSING_RANK_TIMEOUTS)
    return ("on 1 and 3 ranks, with no launcher variables to fall back on, every rank joined the gloo group as "
            "itself; with 2 processes for world_size=3, rank 0 reported '2/3 clients joined' and rank 1 a "
            f"'wait timeout', after the timeout they were given ({shown}), not gloo's 30 minutes.")


#: The missing-rank case runs with each of these ``timeout_s``: a fixed timeout cannot fit both.
_MISSING_RANK_TIMEOUTS = (1, 3)
#: How much later than ``timeout_s`` the first rank (the client) may raise, on a loaded machine; the store's
#: host may take a second more.
_LATE_MARGIN_S = 1.5


# --------------------------------------------------------------------------- 02.3


def _slow_reads_store(store, delay_s):
    """A store whose reads (``check``, ``get``, ``num_keys``, ``multi_get``) return only after ``delay_s``
    seconds, as over a slow network; writes, ``add`` and ``compare_set`` go straight to ``store``.

    A ``torch.distributed.Store`` of its own (so a ``PrefixStore`` can wrap it), built on the rank.
    """
    import torch.distributed as dist

    class SlowReads(dist.Store):
        def __init__(self):
            super().__init__()

        def _slow(self, value):
            time.sleep(delay_s)
            return value

        def check(self, keys):
            return self._slow(store.check(keys))

        def get(self, key):
            return self._slow(store.get(key))

        def num_keys(self):
            return self._slow(store.num_keys())

        def multi_get(self, keys):
            return self._slow(store.multi_get(keys))

        def set(self, key, value):
            return store.set(key, value)

        def multi_set(self, keys, values):
            return store.multi_set(keys, values)

        def compare_set(self, key, expected, desired):
            return store.compare_set(key, expected, desired)

        def add(self, key, amount):
            return store.add(key, amount)

        def append(self, key, value):
            return store.append(key, value)

        def delete_key(self, key):
            return store.delete_key(key)

        def wait(self, keys, timeout=None):
            return store.wait(keys) if timeout is None else store.wait(keys, timeout)

        def set_timeout(self, timeout):
            return store.set_timeout(timeout)

    return SlowReads()


def _race_on_ranks(first_to_finish, races):
    """On each rank: one shared TCPStore; per race, a fresh prefix, a common start, this rank's delay.

    A race with ``slow_s`` hands the attempt a store whose reads take ``slow_s`` plus 0.1 s per rank:
    every rank reads before any rank writes, and the writes land in rank order.
    """
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=(rank == 0), timeout=datetime.timedelta(seconds=15))
    seen = []
    for k, (delays, slow_s) in enumerate(races):
        race = dist.PrefixStore(f"race-{k}", store)  # the learner's keys, fresh for every race
        if slow_s:
            race = _slow_reads_store(race, slow_s + 0.1 * rank)
        store.add(f"ready-{k}", 1)
        while int(store.get(f"ready-{k}")) < world_size:  # everyone starts the race together
            time.sleep(0.005)
        time.sleep(delays[rank])
        answer = first_to_finish(race, rank)
        seen.append(answer.decode() if isinstance(answer, bytes) else answer)
        store.add(f"finished-{k}", 1)
        while int(store.get(f"finished-{k}")) < world_size:
            time.sleep(0.005)
    store.add("done", 1)
    while rank == 0 and int(store.get("done")) < world_size:  # the server's host leaves last
        time.sleep(0.005)
    return seen


def _as_rank(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


@exercise("02.3", CHAPTER, "a first-to-finish race on a store", "section 4 (a store on its own)")
def check_first_to_finish(first_to_finish) -> str:
    step = 0.3  # seconds between two ranks' finishes: far above the start-up skew of a loaded machine
    slow_s = 0.3  # in the last race, reads this slow: a check-then-set lets every rank claim
    cases = {1: [((0.0,), 0.0)],
             4: [((1, 0, 2, 3), 0.0), ((0, 2, 3, 1), 0.0), ((3, 2, 0, 1), 0.0), ((0, 0, 0, 0), slow_s)]}
    for world, races in cases.items():
        races = [(tuple(step * d for d in order), slow) for order, slow in races]
        per_rank = _launch.launch(_race_on_ranks, world, args=(first_to_finish, races), init_process_group=False,
                                  timeout=20)
        for k, (delays, slow) in enumerate(races):
            answers = [_as_rank(rank[k]) for rank in per_rank]
            if slow:
                label = (f"world_size={world}, every rank finishing at the same moment, on a store whose reads "
                         f"(check, get) take {slow:.1f} s or more")
                if len(set(map(repr, answers))) != 1 or answers[0] not in range(world):
                    raise Wrong(f"{label}: the winner each rank saw", "one rank, the same on every rank", answers,
                                "a check followed by a set is two steps: every rank can check before any rank "
                                "sets, and each then claims the prize. Claim and read the result in one atomic "
                                "step on the store")
                continue
            first = min(range(world), key=delays.__getitem__)
            label = (f"world_size={world}, ranks finishing after {', '.join(f'{d:.1f}' for d in delays)} s "
                     f"(rank {first} first)")
            if len(set(map(repr, answers))) != 1:
                raise Wrong(f"{label}: the winner each rank saw", [first] * world, answers,
                            "every rank must see the same winner: the claim and the read of the result must be "
                            "one atomic step on the store, or a later rank overwrites the prize")
            if answers[0] != first:
                raise Wrong(f"{label}: the winner", first, answers[0],
                            "the first rank to claim must win: a later claim must leave the prize as it is")
    return ("on 1 and 4 ranks, in races won by the store's host, by a client while the host was last, and by "
            "others, every rank returned the same winner: the rank that finished first; and with every rank "
            "finishing at once on a store with slow reads, all of them agreed on one winner.")


# --------------------------------------------------------------------------- 02.4


def _groups_on_ranks(group_store, path, names):
    """On each rank: one shared FileStore; every rank writes its address in every group, then reads all back."""
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared = dist.FileStore(path, world_size)
    shared.set_timeout(datetime.timedelta(seconds=3))  # a key nobody can see fails in 3 s, not 5 minutes
    stores = {name: group_store(shared, name) for name in names}
    for name, store in stores.items():
        store.set(f"address/{rank}", f"{name}: rank {rank}")
    shared.add("barrier/written", 1)
    while int(shared.get("barrier/written")) < world_size:
        time.sleep(0.005)
    read = {}
    for name, store in stores.items():
        for r in range(world_size):
            try:
                read[name, r] = store.get(f"address/{r}").decode()
            except Exception as e:  # DistStoreError: a store the other ranks cannot see
                read[name, r] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    shared.add("barrier/read", 1)
    while int(shared.get("barrier/read")) < world_size:  # keep the file until everyone has read
        time.sleep(0.005)
    return read


@exercise("02.4", CHAPTER, "a store of its own for each group", "section 4 (a store on its own)")
def check_group_store(group_store) -> str:
    import tempfile

    names, world = ("group-a", "group-b", "1"), 3
    with tempfile.TemporaryDirectory() as tmp:
        per_rank = _launch.launch(_groups_on_ranks, world, args=(group_store, os.path.join(tmp, "shared"), names),
                                  init_process_group=False, timeout=20)
    for rank, read in enumerate(per_rank):
        for name in names:
            for r in range(world):
                expected, got = f"{name}: rank {r}", read[name, r]
                if got == expected:
                    continue
                if got.startswith("DistStoreError") or "Error" in got.split(":")[0]:
                    hint = ("the group's store must pass every call on to the shared store, so that the other "
                            "ranks' keys are there")
                else:
                    hint = "each group needs keys no other group uses: a prefix of its own on the shared store"
                raise Wrong(f"{world} ranks, groups {', '.join(names)}: rank {rank} reads rank {r}'s "
                            f'"address/{r}" through group "{name}"', expected, got, hint)
    quoted = ", ".join(f'"{n}"' for n in names)
    return (f"on {world} ranks sharing one FileStore, each of the groups {quoted} "
            "read every rank's key as that group had written it, never another group's.")
