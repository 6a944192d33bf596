"""benchmarks/browser_latency.py without a browser: two versions are timed interleaved (A, B then B, A), each
page's first change dropped; and the driver stays within one visitor's share of model views (server.shares
.WORK_SHARE), which a --repeats 24 run passed (the server refused the view, the page drew nothing new and the
driver waited 180 s for it)."""
from benchmarks import browser_latency as bl
from server.shares import WORK_SHARE


class FakeTime:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def pace(share=WORK_SHARE):
    t = FakeTime()
    return bl.Pace(share, clock=lambda: t.now, sleep=t.sleep), t


def test_each_repeat_times_both_versions_in_alternating_order_and_drops_each_first():
    calls = []
    samples = bl.interleave([pace()[0], pace()[0]], 3, lambda k, i: calls.append((k, i)) or (100 * k + i, 0.0), 0.0)
    assert calls == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)]
    assert samples == [[(1, 0.0), (2, 0.0), (3, 0.0)], [(101, 0.0), (102, 0.0), (103, 0.0)]]
    assert [len(s) for s in bl.interleave([pace()[0]], 2, lambda k, i: (i, 0.0), 0.0)] == [2]      # one version


def test_a_long_phoenix_nano_run_waits_within_the_visitors_share_of_model_views():
    p, t = pace()
    view = bl.view_gflop("attention", "phoenix-nano")
    assert 20 < view < 40                                   # the server's estimate of one phoenix-nano view
    per_window = []
    for _ in range(6 + 6 * 25):                             # --repeats 24: each control's load, then 25 changes
        p.ask(view)
        per_window.append((t.now, view))
        t.now += 1.0                                        # a change a second: the whole series in minutes
        in_window = sum(g for when, g in per_window if when > t.now - WORK_SHARE["window_s"])
        assert in_window <= WORK_SHARE["max_bytes"]
    assert t.slept and all(0 < s <= WORK_SHARE["window_s"] for s in t.slept)


def test_views_under_a_gflop_never_wait_as_the_server_never_counts_them():
    p, t = pace(dict(max_bytes=10, window_s=600.0))
    for _ in range(1000):
        assert p.ask(bl.view_gflop("attention", "lecture")) == 0.0
    assert not t.slept and bl.view_gflop("mask", "phoenix-nano") < 1
    p.ask(5.0)
    assert p.ask(5.0) > 0 and t.slept                       # 10 GFLOP asked of a share of 10: past 9/10 of it
