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


def test_arrivals_show_lateness_waits_and_who_never_came():
    rows = [(10.0, 10.0, 11.1, "joined; all_reduce gave 3"), (10.0, 10.0, 12.0, "DistStoreError: wait timeout"),
            (10.5, 11.0, 11.1, "joined"), (10.0, None, None, "never called init_process_group")]
    fig = ddpkit.plot_arrivals(rows, timeout=2, title="four ranks")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 3", "rank 2", "rank 1", "rank 0"]  # rank 0 on top
    bars = [(round(p.get_x(), 6), round(p.get_width(), 6), p.get_y() + p.get_height() / 2, p.get_facecolor())
            for p in ax.patches]
    late = [b for b in bars if b[3] == matplotlib.colors.to_rgba("lightgray")]
    assert late == [(0.5, 0.5, 1.0, late[0][3])]  # rank 2 (row 1 from the bottom) started 0.5 s late, waited 0.5 s
    red = [b for b in bars if b[3] == matplotlib.colors.to_rgba("tab:red")]
    assert [(x, w) for x, w, *_ in red] == [(0.0, 2.0)]  # times drawn from the earliest start
    assert [t.get_text() for t in ax.texts] == ["  never arrives"]
    timeouts = [line.get_xdata()[0] for line in ax.lines]
    assert timeouts == pytest.approx([2.0, 2.0, 3.0])  # one mark per rank that called, timeout after its call
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "not there yet (late)", "in init_process_group, joined", "in init_process_group, gave up", "its timeout"]
    assert ax.get_title() == "four ranks"
    assert figure_png(fig)[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="nothing to draw"):
        ddpkit.plot_arrivals([])


def test_rendezvous_picture_draws_the_counts_it_is_given():
    fig = ddpkit.plot_rendezvous([1, 2, 1], {(0, 1): 1, (1, 2): 3}, host_rank=1, everywhere=False)
    ax_store, ax_mesh = fig.axes
    store_texts = numbers(ax_store)
    assert "rank 1's process" in store_texts and "rank 1 client" in store_texts
    assert any("bound to one address" in t for t in store_texts)
    assert sorted(t for t in store_texts if t.isdigit()) == ["1", "1", "2"]  # one count per rank's arrow
    assert len(ax_mesh.lines) == 2 and sorted(t for t in numbers(ax_mesh) if t.isdigit()) == ["1", "3"]
    assert figure_png(fig)[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="host_rank 3"):
        ddpkit.plot_rendezvous([1, 1], {}, host_rank=3)


def _cluster_rows(nnodes, per_node):
    return [{"RANK": r, "LOCAL_RANK": r % per_node, "GROUP_RANK": r // per_node,
             "LOCAL_WORLD_SIZE": per_node, "WORLD_SIZE": nnodes * per_node} for r in range(nnodes * per_node)]


def test_plot_cluster_draws_one_box_per_node_and_one_labelled_square_per_process():
    fig = ddpkit.plot_cluster(_cluster_rows(2, 3))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts]
    assert [label for label in labels if label.startswith("node")] == ["node 0\nGROUP_RANK 0", "node 1\nGROUP_RANK 1"]
    squares = [label for label in labels if label.startswith("RANK")]
    assert squares == [f"RANK {r}\nLOCAL_RANK {r % 3}" for r in range(6)]
    assert len(ax.patches) == 2 + 6  # two node boxes, six process squares
    assert ax.get_title().splitlines()[0] == "2 node(s) x 3 process(es) = world size 6"


def test_plot_cluster_marks_the_processes_whose_highlighted_variable_is_0():
    from matplotlib.colors import to_rgb

    for highlight, marked in (("RANK", [0]), ("LOCAL_RANK", [0, 2])):
        fig = ddpkit.plot_cluster(_cluster_rows(2, 2), highlight=highlight)
        squares = fig.axes[0].patches[2:]  # after the two node boxes, one square per rank in order
        orange = [r for r, p in enumerate(squares) if p.get_facecolor()[:3] == to_rgb("tab:orange")]
        assert orange == marked, (highlight, orange)
    with pytest.raises(ValueError, match="empty"):
        ddpkit.plot_cluster([])


def test_digits_are_drawn_with_their_labels():
    digits = ddpkit.load_digits()
    fig = ddpkit.plot_digits(digits.x_train, digits.y_train, count=4)
    assert [ax.get_title() for ax in fig.axes] == [str(int(v)) for v in digits.y_train[:4]]
    assert all(ax.images[0].get_array().shape == (8, 8) for ax in fig.axes)


def test_runs_identical_curves_share_a_line_and_bars_show_their_values():
    a = {"losses": [1.0, 0.5], "samples_per_s": 900.0}
    b = {"losses": [1.0, 0.5 + 1e-6], "samples_per_s": 1800.0}       # within the tolerance: one line
    c = {"losses": [1.0, 0.4], "samples_per_s": 300.0}
    fig = ddpkit.plot_runs([("a", a), ("b", b), ("c", c)], title="three runs")
    curves, bars = fig.axes
    assert [t.get_text() for t in curves.get_legend().get_texts()] == ["a = b (identical)", "c"]
    assert len(curves.lines) == 2 and fig._suptitle.get_text() == "three runs"
    assert [t.get_text() for t in bars.texts] == ["900", "1,800", "300"]
    assert bars.get_xlim()[0] == 0                                   # lengths compare
    assert figure_png(fig)[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="empty"):
        ddpkit.plot_runs([])


def test_partition_rows_are_the_ranks_shares_hatched_padding_and_a_dropped_row():
    from torch.utils.data.distributed import DistributedSampler

    def shares(n, world, drop_last):
        return [list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False, drop_last=drop_last))
                for r in range(world)]

    fig = ddpkit.plot_partition([("padded", shares(10, 4, False)), ("trimmed", shares(10, 4, True))], 10)
    padded, trimmed = fig.axes
    assert [padded.get_title(), trimmed.get_title()] == ["padded", "trimmed"]
    assert [t.get_text() for t in padded.get_yticklabels()] == ["rank 0", "rank 1", "rank 2", "rank 3", "dropped"]
    # padded: 12 boxes, the two padding duplicates (items 0 and 1, on ranks 2 and 3) hatched; nothing dropped
    hatched = [(int(p.get_y()), int(p.get_x())) for p in padded.patches if p.get_hatch()]
    assert len(padded.patches) == 12 and hatched == [(2, 2), (3, 2)]
    assert numbers(padded)[-1] == "(none)"
    # trimmed: 8 boxes, no hatching, items 8 and 9 in the grey "dropped" row, below the line under the ranks
    assert len(trimmed.patches) == 10 and not any(p.get_hatch() for p in trimmed.patches)
    (line,) = trimmed.lines
    below = line.get_ydata()[0]
    assert 4 < below < 5 and [t.get_text() for t in trimmed.texts if t.get_position()[1] > below] == ["8", "9"]
    # the positions (only the share's: 0, 1) are on top; the legend is beside the panels, not in a title
    assert trimmed.xaxis.get_label_position() == "top" and trimmed.get_xlabel() == "position in the rank's share"
    assert [t.get_text() for t in trimmed.get_xticklabels()] == ["0", "1"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a sample\n(its dataset index)", "padding duplicate",
                                                          "dropped:\ngiven to no rank"]
    assert fig.get_suptitle() == ""
    assert len(fig.axes) == 2 and padded.get_position().y0 == trimmed.get_position().y0   # narrow: side by side
    assert figure_png(fig)[:4] == b"\x89PNG"
    empty = ddpkit.plot_partition([("3 on 8, drop_last", shares(3, 8, True))], 3)
    assert numbers(empty.axes[0]).count("(nothing)") == 8
    with pytest.raises(ValueError, match="at least one"):
        ddpkit.plot_partition([], 10)


def test_plot_holdings_draws_each_ranks_real_entries_where_they_sit():
    whole = torch.arange(24).reshape(4, 6)
    shard1 = [((r,), part, part, False) for r, part in enumerate(whole.chunk(4, dim=1))]  # uneven: 2, 2, 2
    shard1.append(((3,), whole[:, 6:], whole[:, 6:], False))  # torch.chunk made 3 pieces: rank 3 holds (4, 0)
    partial = [((r,), whole, torch.where(whole % 2 == r, whole, 0), True) for r in range(2)]
    fig = ddpkit.plot_holdings([("Shard(1)", shard1), ("Partial()", partial)], (4, 6), title="t")
    (ax,) = fig.axes  # every panel in one set of axes
    texts = numbers(ax)
    assert fig.get_suptitle() == "t" and "Shard(1)" in texts and "Partial()" in texts
    assert texts.count("holds nothing") == 1 and "rank 3 at (3,)\nlocal (4, 0)" in texts
    assert sum(" at (" in t for t in texts) == 6  # one title per rank that holds something or not
    assert all(t.get_fontsize() >= 9 for t in ax.texts if t.get_text() in ("Shard(1)", "Partial()"))  # readable rows
    cells, hatched, frames = ax.collections
    assert len(cells.get_paths()) == 24 and len(hatched.get_paths()) == 48 and len(frames.get_paths()) == 6
    assert hatched.get_hatch() == "///" and cells.get_hatch() is None
    # rank 1's Shard(1) cells sit in columns 2 and 3 of its panel (panel 1 starts at 6 + 0.6 cells)
    xs = sorted({round(p.vertices[0][0] - 6.6, 6) for p in cells.get_paths()[8:16]})
    assert xs == [2.0, 3.0]
    assert figure_png(fig).startswith(b"\x89PNG")


def test_plot_holdings_refuses_positions_that_do_not_match_the_values():
    with pytest.raises(ValueError, match="positions"):
        ddpkit.plot_holdings([("bad", [((0,), torch.arange(4), torch.arange(3), False)])], (2, 2))
    with pytest.raises(ValueError, match="empty"):
        ddpkit.plot_holdings([], (2, 2))


def _restart_events():
    """A two-rank job as chapter 06's train.py logs it: rank 1 crashes before step 2, both ranks start again."""
    ev = []
    for rank in (0, 1):
        ev += [{"t": 0.0 + rank / 100, "rank": rank, "restart": 0, "event": "launched", "step": 0},
               {"t": 2.0, "rank": rank, "restart": 0, "event": "ready", "step": 0},
               {"t": 2.1, "rank": rank, "restart": 0, "event": "step", "step": 0},
               {"t": 2.2, "rank": rank, "restart": 0, "event": "step", "step": 1},
               {"t": 2.3, "rank": rank, "restart": 0, "event": "checkpoint", "step": 2},
               {"t": 5.0, "rank": rank, "restart": 1, "event": "launched", "step": 0},
               {"t": 7.0, "rank": rank, "restart": 1, "event": "ready", "step": 2},
               {"t": 7.1, "rank": rank, "restart": 1, "event": "step", "step": 2},
               {"t": 7.2, "rank": rank, "restart": 1, "event": "finished", "step": 3}]
    ev.append({"t": 2.4, "rank": 1, "restart": 0, "event": "crash", "step": 2})
    return ev


def test_attempts_are_counted_per_rank_from_its_launches_not_from_the_restart_counter():
    events = _restart_events()
    for e in events:
        if e["rank"] == 0:
            e["restart"] = 0  # an agent whose worker was restarted by a membership change counts no restart
    numbered = ddpkit.number_attempts(reversed(events))  # any order in, oldest first out
    assert [e["t"] for e in numbered] == sorted(e["t"] for e in events)
    assert {(e["rank"], e["event"], e["attempt"]) for e in numbered if e["event"] == "ready"} == {
        (0, "ready", 0), (0, "ready", 1), (1, "ready", 0), (1, "ready", 1)}
    assert all("attempt" not in e for e in events), "the events given are not changed"


def test_the_restart_timeline_has_a_row_per_attempt_and_rank_and_marks_the_crash():
    fig = ddpkit.plot_restarts(_restart_events(), title="rank 1 crashes before step 2")
    whole, zoom = fig.axes
    assert whole.get_title() == "rank 1 crashes before step 2"
    assert [t.get_text() for t in whole.get_yticklabels()] == ["rank 0", "rank 1"]
    assert [t.get_text() for t in zoom.get_yticklabels()] == [
        "attempt 0, rank 0", "attempt 0, rank 1", "attempt 1, rank 0", "attempt 1, rank 1"]
    legend = [t.get_text() for t in zoom.get_legend().get_texts()]
    assert legend == ["a step done", "checkpoint written (above its row)", "crash"]
    crash = next(line for line in zoom.get_lines() if line.get_label() == "crash")
    assert list(crash.get_xdata()) == [1.5]  # drawn between step 1 and step 2, where it happened
    assert figure_png(fig).startswith(b"\x89PNG")


def test_the_restart_timeline_refuses_no_events():
    with pytest.raises(ValueError, match="nothing to draw"):
        ddpkit.plot_restarts([])


def _ring_history(n):
    """What chapter 03's ring_all_reduce records on each of n ranks, computed here without any process."""
    start = [torch.arange(1.0, n + 1) + n * r for r in range(n)]
    chunks = [list(t.clone().chunk(n)) for t in start]
    history = [[("start", None, start[r].clone())] for r in range(n)]
    for step in range(n - 1):
        sent = [chunks[r][(r - step) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[r][(r - step - 1) % n] += sent[(r - 1) % n]
            history[r].append((f"reduce-scatter {step + 1}", (r - step - 1) % n, torch.cat(chunks[r])))
    for step in range(n - 1):
        sent = [chunks[r][(r - step + 1) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[r][(r - step) % n].copy_(sent[(r - 1) % n])
            history[r].append((f"all-gather {step + 1}", (r - step) % n, torch.cat(chunks[r])))
    return history


def test_the_ring_is_drawn_step_by_step_with_the_received_chunk_outlined():
    n = 4
    fig = ddpkit.plot_ring_steps(_ring_history(n))
    top, bottom = fig.axes  # one picture per half: reduce-scatter, then all-gather
    assert top.get_title().startswith("reduce-scatter") and bottom.get_title().startswith("all-gather")
    assert [t.get_text() for t in top.get_yticklabels()] == [f"rank {r}" for r in range(n)]
    titles = [t.get_text() for t in top.texts if t.get_va() == "bottom"]
    assert titles == ["start", "step 1", "step 2", "step 3"]
    values = [t.get_text() for t in top.texts if t.get_va() == "center"]  # panel by panel, rank by rank
    assert values[:n] == ["1", "2", "3", "4"]  # rank 0's starting tensor
    after = values[(n - 1) * n * n:]  # the last reduce-scatter panel
    assert after[1] == "32"  # rank 0's chunk 1 is now the full sum, 2+6+10+14
    assert len(top.patches) == n * (n - 1) == len(bottom.patches)  # one red box per rank and step
    end = [t.get_text() for t in bottom.texts if t.get_va() == "center"][-n * n:]
    assert end == ["28", "32", "36", "40"] * n  # every rank holds the whole sum
    assert figure_png(fig).startswith(b"\x89PNG")


def test_the_ring_drawing_refuses_records_of_the_wrong_length():
    history = _ring_history(3)
    with pytest.raises(ValueError, match="2\\(n-1\\)\\+1 = 5 steps per rank"):
        ddpkit.plot_ring_steps([h[:-1] for h in history])
