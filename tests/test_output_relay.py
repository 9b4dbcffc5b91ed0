"""The output relay drops the clock time of PyTorch's C++ log prefix (issue 26), and nothing else.

The lines below are copied from real ranks' standard error on PyTorch 2.13.0 (chapter 11's runs):
c10's log prefix is ``[<severity><MMDD> <HH:MM:SS.nanoseconds> <file>:<line>]``, after the
``[rankN]:`` that c10d adds once the rank is known.
"""

from __future__ import annotations

import pytest

from ddpkit._output import Relay

REAL = [
    ("[rank0]:[E1202 00:55:13.554803747 ProcessGroupGloo.cpp:67] [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms",
     "[rank0]:[E ProcessGroupGloo.cpp:67] [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"),
    ("[rank1]:[W1202 00:55:21.960109744 socket.cpp:469] [c10d] waitForInput: poll returned 0, likely a timeout",
     "[rank1]:[W socket.cpp:469] [c10d] waitForInput: poll returned 0, likely a timeout"),
    # before the group exists a line has no rank of its own: the relay adds it
    ("[W1130 12:34:56.789012345 TCPStore.cpp:340] [c10d] TCP client failed to connect",
     "[rank0]: [W TCPStore.cpp:340] [c10d] TCP client failed to connect"),
    # glog's format carries a thread id after the time
    ("[I1130 12:34:56.789012 4242 ProcessGroupNCCL.cpp:900] NCCL_DEBUG: N/A",
     "[rank0]: [I ProcessGroupNCCL.cpp:900] NCCL_DEBUG: N/A"),
]


@pytest.mark.parametrize("line, shown", REAL)
def test_a_cpp_log_line_is_shown_without_its_clock_time(line, shown, capsys):
    relay = Relay()
    relay.line(("rank", 0) if not line.startswith("[rank1]") else ("rank", 1), "err", line)
    relay.finish()
    assert capsys.readouterr().err == shown + "\n"


@pytest.mark.parametrize("line", [
    "epoch 1 loss 0.41 at 12:34:56.789",              # a learner's own time of day stays
    "[W1130 reducer.cpp] Warning: no clock here",     # a prefix without a time is left as it is
    "x [W1130 12:34:56.789012345 socket.cpp:469] not at the start of the line",
])
def test_other_lines_are_left_alone(line, capsys):
    relay = Relay()
    relay.feed(("rank", 0), "out", (line + "\n").encode())
    assert capsys.readouterr().out == f"[rank0]: {line}\n"


def test_a_real_cpp_warning_reaches_the_cell_without_its_clock(capfd):
    # DDP's reducer warns from C++ when find_unused_parameters=True finds none: a real c10 log line
    import re

    import ddpkit

    def warn_from_cpp():
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(torch.nn.Linear(2, 2), find_unused_parameters=True)
        model(torch.ones(1, 2)).sum().backward()

    ddpkit.launch(warn_from_cpp, 2)
    lines = [line for line in capfd.readouterr().err.splitlines() if "find_unused_parameters=True" in line]
    assert [line[:11] for line in lines] == ["[rank0]:[W ", "[rank1]:[W "], lines
    assert not any(re.search(r"\d\d:\d\d:\d\d\.\d+", line) for line in lines), lines
