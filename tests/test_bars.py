"""ddpkit.plot_bars: the experiment's bars of chapter 12, drawn without pyplot."""

import threading

import ddpkit


def test_bars_are_labelled_in_order_with_their_scaled_values():
    fig = ddpkit.plot_bars({"a": 0.0015, "b": 0.25, "c": 0.0}, unit="ms", scale=1e3, title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.texts] == [" 1.5 ms", " 250.0 ms", " 0.0 ms"]
    assert [round(p.get_width(), 6) for p in ax.patches] == [1.5, 250.0, 0.0]
    assert ax.get_title() == "t" and ax.get_xlim()[1] > 250.0


def test_bars_draw_on_another_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(ddpkit.plot_bars({"x": 1.0}, unit="s", scale=1.0)))
    worker.start()
    worker.join()
    assert out and out[0].axes[0].texts[0].get_text() == " 1.0 s"
