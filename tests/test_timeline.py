"""ddpkit.Timeline, idle_fraction and plot_timeline (chapter 07's pipeline timelines)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import ddpkit
from ddpkit import Span


def _relay():
    # rank 0 works 0.2 s, then hands a tensor to rank 1, which works 0.1 s after receiving it
    timeline = ddpkit.Timeline()
    token = torch.zeros(1)
    if dist.get_rank() == 0:
        with timeline.span("F", 0):
            time.sleep(0.2)
        dist.send(token, dst=1)
    else:
        dist.recv(token, src=0)
        with timeline.span("F", 0):
            time.sleep(0.1)
    return timeline.spans


def test_ranks_share_the_clock_origin_so_causality_shows():
    first, second = (spans[0] for spans in ddpkit.launch(_relay, world_size=2))
    assert second.start >= first.end, (first, second)            # one machine: one time axis, so causality shows
    assert second.start - first.end < 0.15                       # and started soon after it
    assert 0.19 <= first.seconds and 0.09 <= second.seconds


def test_idle_fraction_counts_every_rank_over_the_whole_run():
    gpipe_like = [[Span("F", "0", 0, 1), Span("B", "0", 3, 4)], [Span("F", "0", 1, 2), Span("B", "0", 2, 3)]]
    assert ddpkit.idle_fraction(gpipe_like) == pytest.approx(0.5)
    assert ddpkit.idle_fraction(gpipe_like, kinds=["F"]) == pytest.approx(0.75)
    assert ddpkit.idle_fraction(gpipe_like, per_rank=True) == [pytest.approx(0.5), pytest.approx(0.5)]
    assert ddpkit.idle_fraction([[Span("F", "0", 0, 2)], [Span("F", "0", 0, 2)]]) == 0.0
    with pytest.raises(ValueError, match="no spans recorded"):
        ddpkit.idle_fraction([[], []])


def test_a_span_is_recorded_even_when_its_block_raises():
    timeline = ddpkit.Timeline()
    with pytest.raises(RuntimeError):
        with timeline.span("B", 7):
            raise RuntimeError("boom")
    assert [(s.kind, s.label) for s in timeline.spans] == [("B", "7")]


def test_plot_timeline_draws_one_row_per_rank_and_a_legend_per_kind():
    spans = [[Span("F", "0", 0.0, 0.01), Span("B", "0", 0.03, 0.05)], [Span("F", "0", 0.01, 0.02)], []]
    fig = ddpkit.plot_timeline(spans, title="t", row_names=["a", "b", "c"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["F (forward)", "B (backward)"]
    assert len(ax.patches) == 3 and ax.get_xlim()[1] == pytest.approx(50 * 1.01)


def _equal_stages(p: int, m: int, f: float = 1.0, b: float = 2.0, hop: float = 0.0):
    # GPipe on p ranks, every forward f and backward b long, each message `hop` late
    ranks = [[] for _ in range(p)]
    ends = {}
    for r in range(p):
        clock = 0.0
        for i in range(m):
            start = max(clock, ends[r - 1, "F", i] + hop) if r else clock
            ranks[r].append(Span("F", str(i), start, start + f))
            clock = ends[r, "F", i] = start + f
    for r in reversed(range(p)):
        clock = max(s.end for s in ranks[r])
        for i in range(m):
            start = max(clock, ends[r + 1, "B", i] + hop) if r < p - 1 else clock
            ranks[r].append(Span("B", str(i), start, start + b))
            clock = ends[r, "B", i] = start + b
    return ranks


def test_replay_of_equal_stages_gives_the_bubble_formula_and_removes_message_time():
    for p, m in ((2, 1), (2, 8), (4, 8), (3, 5)):
        formula = (p - 1) / (m + p - 1)
        free = _equal_stages(p, m)
        assert ddpkit.idle_fraction(free) == pytest.approx(formula)
        late = _equal_stages(p, m, hop=0.3)                         # messages cost time: more idle
        assert ddpkit.idle_fraction(late) > formula + 0.01
        replayed = ddpkit.replay_pipeline(late)
        assert ddpkit.idle_fraction(replayed) == pytest.approx(formula)
        assert [[(s.kind, s.label) for s in r] for r in replayed] == [[(s.kind, s.label) for s in r] for r in late]
        assert min(s.start for r in replayed for s in r) == 0.0


def test_replay_keeps_each_ranks_order_ignores_other_kinds_and_names_a_stuck_span():
    one_f_one_b = [[Span("F", "0", 0, 1), Span("F", "1", 1, 2), Span("B", "0", 4, 6), Span("B", "1", 7, 9)],
                   [Span("send", "", 0, 9), Span("F", "0", 1.2, 2.2), Span("B", "0", 2.2, 4.2),
                    Span("F", "1", 4.3, 5.3), Span("B", "1", 5.3, 7.3)]]
    replayed = ddpkit.replay_pipeline(one_f_one_b)
    assert [f"{s.kind}{s.label}" for s in replayed[1]] == ["F0", "B0", "F1", "B1"]   # the send span is dropped
    assert [(s.start, s.end) for s in replayed[0]] == [(0, 1), (1, 2), (4, 6), (7, 9)]
    assert ddpkit.idle_fraction(replayed) <= ddpkit.idle_fraction([r[-4:] for r in one_f_one_b])
    with pytest.raises(ValueError, match="rank 1: F0"):
        ddpkit.replay_pipeline([[Span("B", "0", 0, 1)], [Span("F", "0", 0, 1), Span("B", "0", 1, 2)]])


def test_plot_timeline_names_the_split_backward_of_zero_bubble_schedules():
    spans = [[Span("F", "s0:0", 0.0, 0.01), Span("I", "s0:0", 0.01, 0.02), Span("W", "s0:0", 0.02, 0.03)]]
    legend = ddpkit.plot_timeline(spans).axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["F (forward)", "I (input gradient)", "W (weight gradient)"]
