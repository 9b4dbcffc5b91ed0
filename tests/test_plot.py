"""ddpkit._plot: the pictures show exactly the values they were given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
import torch.distributed as dist

import ddpkit
from ddpkit._widgets import figure_png


@pytest.fixture(autouse=True)
def _no_pyplot_figures():
    """The pictures are built without pyplot (safe in an experiment's callback thread)."""
    plt.close("all")
    yield
    assert plt.get_fignums() == [], "a plot function went through pyplot's global state"


def numbers(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_one_row_per_rank_and_a_column_for_before_and_after():
    before = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([5.0, 6.0])]
    after = [torch.tensor([9.0, 12.0])] * 3
    fig = ddpkit.plot_ranks(before, after, title="all_reduce(SUM)")
    axes = fig.axes
    assert len(axes) == 6
    assert [axes[2 * r].get_ylabel() for r in range(3)] == ["rank 0", "rank 1", "rank 2"]
    assert [axes[0].get_title(), axes[1].get_title()] == ["before", "after"]
    assert fig._suptitle.get_text() == "all_reduce(SUM)"
    assert [numbers(axes[2 * r]) for r in range(3)] == [["1", "2"], ["3", "4"], ["5", "6"]]
    assert all(numbers(axes[2 * r + 1]) == ["9", "12"] for r in range(3))


def test_one_colour_scale_for_the_whole_figure():
    fig = ddpkit.plot_ranks([torch.tensor([0.0]), torch.tensor([10.0])], [torch.tensor([5.0])] * 2)
    limits = {ax.images[0].get_clim() for ax in fig.axes}
    assert limits == {(0.0, 10.0)}


def test_lists_of_tensors_become_rows_and_none_an_empty_box():
    chunks = [torch.tensor([1, 2]), torch.tensor([3, 4])]
    fig = ddpkit.plot_ranks([chunks, None], [chunks[0], chunks[1]], title="scatter")
    rank0_before, rank0_after, rank1_before, _ = fig.axes
    assert rank0_before.images[0].get_array().shape == (2, 2)
    assert numbers(rank0_before) == ["1", "2", "3", "4"]
    assert numbers(rank1_before) == ["-"] and not rank1_before.images
    assert rank1_before.spines["top"].get_linestyle() == "--"
    assert numbers(rank0_after) == ["1", "2"]


def test_single_values_sit_side_by_side_and_uneven_lists_are_concatenated():
    singles = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])]
    fig = ddpkit.plot_ranks([singles, [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]])
    assert fig.axes[0].images[0].get_array().shape == (1, 3)
    assert fig.axes[1].images[0].get_array().shape == (1, 3)
    assert numbers(fig.axes[1]) == ["1", "2", "3"]


def test_objects_are_written_as_text_and_floats_rounded():
    fig = ddpkit.plot_ranks([{"lr": 0.1}, "hi"], [torch.tensor([1 / 3, 2.5])] * 2)
    assert numbers(fig.axes[0]) == ["{'lr': 0.1}"]
    assert numbers(fig.axes[2]) == ["'hi'"]
    assert numbers(fig.axes[1]) == ["0.333", "2.5"]


def test_long_objects_are_wrapped_to_stay_inside_their_box():
    objs = [{"rank": r, "host": f"node{r // 2}"} for r in range(4)]
    fig = ddpkit.plot_ranks(objs, [objs] * 4, title="all_gather_object")
    text = fig.axes[1].texts[0]
    assert text.get_text().count("\n") >= 3  # a list of four dicts: several lines
    assert text.get_text().replace("\n", " ") == repr(objs)
    figure_png(fig)  # draw, so the text's extent is known
    renderer = fig.canvas.get_renderer()
    inside = fig.axes[1].get_window_extent(renderer)
    box = text.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1


def test_log_scale_for_values_spanning_orders_of_magnitude():
    fig = ddpkit.plot_ranks([torch.tensor([1.0, 2.0])], [torch.tensor([585.0, 6144.0])], log=True)
    image = fig.axes[1].images[0]
    assert type(image.norm).__name__ == "LogNorm" and image.get_clim() == (1.0, 6144.0)
    with pytest.raises(ValueError, match="positive"):
        ddpkit.plot_ranks([torch.tensor([0.0, 2.0])], log=True)


def test_each_column_is_as_wide_as_its_own_values():
    before = [[torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([4.0])], None, None, None]
    after = [torch.tensor([float(r + 1)]) for r in range(4)]  # scatter: 4 values before, 1 after
    fig = ddpkit.plot_ranks(before, after, title="scatter: each rank's value before and after")
    rank0_before, rank0_after = fig.axes[0], fig.axes[1]
    assert rank0_before.get_xlim() == (0.0, 4.0) and rank0_after.get_xlim() == (0.0, 1.0)
    figure_png(fig)
    renderer = fig.canvas.get_renderer()
    # the narrow "after" panel is narrower than "before", and its number still fills its cell
    assert rank0_after.get_window_extent(renderer).width < rank0_before.get_window_extent(renderer).width / 2
    # the title is wrapped, never wider than the figure
    assert fig._suptitle.get_window_extent(renderer).width <= fig.bbox.width


def test_a_single_column_without_after():
    fig = ddpkit.plot_ranks([torch.zeros(3), torch.ones(3)])
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == ""


def test_bad_inputs_are_explained():
    with pytest.raises(ValueError, match="before has 2 ranks but after has 1"):
        ddpkit.plot_ranks([1, 2], [3])
    with pytest.raises(ValueError, match="empty"):
        ddpkit.plot_ranks([])


def test_pictures_of_a_real_all_gather():
    def work():
        mine = torch.arange(3.0) + 10 * dist.get_rank()
        gathered = [torch.empty(3) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        return mine, gathered

    results = ddpkit.launch(work, world_size=2)
    fig = ddpkit.plot_ranks([b for b, _ in results], [a for _, a in results])
    assert numbers(fig.axes[2]) == ["10", "11", "12"]
    assert numbers(fig.axes[3]) == ["0", "1", "2", "10", "11", "12"]


def test_bandwidth_plot_draws_the_rows_it_is_given():
    rows = [ddpkit.BandwidthRow("all_reduce", ws, n, n / 1e9) for ws in (2, 4) for n in (4096, 1024)]
    copy = [{"op": "copy", "world_size": 1, "nbytes": n, "seconds": n / 1e10, "busbw": 10.0} for n in (1024, 4096)]
    fig = ddpkit.plot_bandwidth(rows, copy)
    time_ax, bw_ax = fig.axes
    labels = [line.get_label() for line in bw_ax.lines]
    assert labels == ["all_reduce, 2 ranks", "all_reduce, 4 ranks", "copy, 1 process"]
    two = bw_ax.lines[0]
    assert list(two.get_xdata()) == [1024, 4096]  # sorted by size
    assert list(two.get_ydata()) == pytest.approx([1.0, 1.0])  # busbw = algbw for 2 ranks
    assert list(bw_ax.lines[1].get_ydata()) == pytest.approx([1.5, 1.5])
    assert list(time_ax.lines[0].get_ydata()) == pytest.approx([1.024, 4.096])
    assert [line.get_linestyle() for line in bw_ax.lines] == ["-", "-", "--"]
    assert time_ax.get_xscale() == "log" and bw_ax.get_yscale() == "log"
    assert bw_ax.get_xlabel() == "size: the tensor each rank reduces"  # the ticks say KiB / MiB
    assert bw_ax.get_ylabel() == "bus bandwidth (GB/s)\nfor the copy: GB copied per s"
    assert [t.get_text() for t in bw_ax.get_xticklabels()] == ["1 KiB", "4 KiB"]


def test_bandwidth_plot_without_a_reference_says_bus_bandwidth_only():
    fig = ddpkit.plot_bandwidth([ddpkit.BandwidthRow("all_reduce", 2, 4096, 1e-5)])
    assert fig.axes[1].get_ylabel() == "bus bandwidth (GB/s)"
    mixed = ddpkit.plot_bandwidth([ddpkit.BandwidthRow(op, 2, 4096, 1e-5) for op in ("all_reduce", "all_gather")])
    assert "ddpkit.size_meaning" in mixed.axes[0].get_xlabel() and "_bench" not in mixed.axes[0].get_xlabel()


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all"])
def test_bandwidth_axis_says_what_the_size_is_for_each_op(op):
    fig = ddpkit.plot_bandwidth([ddpkit.BandwidthRow(op, 2, 4096, 1e-5)])
    assert fig.axes[0].get_xlabel() == f"size: {ddpkit.size_meaning(op)}"
    assert "n x" in ddpkit.size_meaning(op) or op == "all_to_all"
