"""ddpkit._memory: chapter 09's experiment shows exactly the bytes it was given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

import ddpkit

ROWS = {
    "DDP": ({"parameters": 4000, "gradients": 4000, "kept": 0}, 3000.0, {"allreduce_": 1}),
    "FSDP2": ({"parameters": 1000, "gradients": 1000, "kept": 4000}, 4500.0,
              {"_allgather_base_": 6, "_reduce_scatter_base_": 3}),
}


def test_bars_stack_each_kind_in_kB_and_the_traffic_panel_shows_what_was_received():
    plt.close("all")
    fig = ddpkit.plot_memory(ROWS, title="2 ranks")
    memory, traffic = fig.axes
    assert [round(b.get_width(), 3) for b in memory.patches] == [4.0, 1.0, 4.0, 1.0, 0.0, 4.0]
    assert [round(b.get_x(), 3) for b in memory.patches[2:4]] == [4.0, 1.0]   # stacked after the parameters
    assert [round(b.get_width(), 3) for b in traffic.patches] == [3.0, 4.5]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["parameters", "gradients", "kept"]
    assert fig._suptitle.get_text() == "2 ranks"
    assert plt.get_fignums() == [], "drawn without pyplot"


def test_one_rank_receives_nothing_and_says_so():
    alone = {name: (memory, 0.0, {}) for name, (memory, _, _) in ROWS.items()}
    traffic = ddpkit.plot_memory(alone).axes[1]
    assert traffic.get_xlim() == (0.0, 1.0)
    assert [t.get_text() for t in traffic.texts] == ["nothing received"]


def test_the_table_sums_the_memory_and_lists_the_calls():
    lines = ddpkit.memory_table(ROWS, columns=("params", "grads", "kept")).splitlines()
    assert lines[0].split() == ["strategy", "params", "grads", "kept", "sum", "received", "collectives"]
    assert lines[1].split() == ["DDP", "4,000", "4,000", "0", "8,000", "3,000", "allreduce_", "x1"]
    assert lines[2].split()[4:6] == ["6,000", "4,500"]
    assert lines[2].endswith("_allgather_base_ x6, _reduce_scatter_base_ x3")
    assert ddpkit.memory_table({"none": ({"a": 1}, 0.0, {})}).endswith("none")


def test_rows_must_agree_on_their_kinds():
    with pytest.raises(ValueError, match="same kinds"):
        ddpkit.plot_memory({"a": ({"x": 1}, 0.0, {}), "b": ({"y": 1}, 0.0, {})})
    with pytest.raises(ValueError, match="column names"):
        ddpkit.memory_table(ROWS, columns=("one",))
