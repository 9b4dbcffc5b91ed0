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
