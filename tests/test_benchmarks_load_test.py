"""The soak's A/B (benchmarks/load_test.py --soak --before REF): the two versions alternate run by run, each run
is a fresh app of its own checkout, and the file keeps every run and each version's spread."""
import json
import os
import types
from pathlib import Path

import pytest

from benchmarks import load_test


def fake_run(views_p95: float) -> dict:
    return dict(honest_mask_p95_s=0.5, honest_model_views_p95_s=views_p95, classroom_views_p95_s=views_p95 - 1,
                honest_total=dict(requests=1000, failures=0, refused_by_name=0), cpu_seconds=dict(server_s=90.0),
                memory=dict(peak_rss_gb=4.0, rss_after_gb=1.2))


def test_the_versions_alternate_so_a_slow_spell_falls_on_both():
    assert load_test.ab_order(3) == ["before", "after", "after", "before", "before", "after"]
    assert load_test.ab_order(1) == ["before", "after"]


def test_the_ab_soaks_each_version_from_its_own_checkout_and_keeps_every_run(tmp_path, monkeypatch):
    roots, p95 = [], iter([9.0, 7.0, 6.0, 10.0, 8.0, 5.0])     # before, after, after, before, before, after

    def soak_once(a, attacks, duration_s, after_s=30.0, root=None, own_session=True):
        roots.append(root)
        assert own_session                      # without --before-shared-session, both sides as the suite runs
        if root is not None:                    # the before version: the commit's files, not this tree's
            assert (root / "app.py").is_file() and root != load_test.ROOT
        return fake_run(next(p95))
    monkeypatch.setattr(load_test, "soak_once", soak_once)
    out = tmp_path / "ab.json"
    a = types.SimpleNamespace(before="HEAD", pairs=3, duration=60.0, sessions=30, attacks=[], conditions="test",
                              out=out, before_shared_session=False)
    report = load_test.main_soak_ab(a)
    assert [r is None for r in roots] == [False, True, True, False, False, True]
    assert report == json.loads(out.read_text())
    assert [r["version"] for r in report["runs"]] == load_test.ab_order(3)
    after, before = report["summary"]["after"], report["summary"]["before"]
    assert after["honest_model_views_p95_s"] == dict(min=5.0, median=6.0, max=7.0)
    assert before["honest_model_views_p95_s"] == dict(min=8.0, median=9.0, max=10.0)
    assert before["classroom_views_p95_s"]["median"] == 8.0 and report["before"]["commit"]


def test_the_before_side_can_run_its_app_in_the_soaks_session_and_the_file_says_so(tmp_path, monkeypatch):
    sessions = []

    def soak_once(a, attacks, duration_s, after_s=30.0, root=None, own_session=True):
        sessions.append((root is None, own_session))
        return fake_run(5.0)
    monkeypatch.setattr(load_test, "soak_once", soak_once)
    a = types.SimpleNamespace(before="HEAD", pairs=2, duration=60.0, sessions=30, attacks=[], conditions="test",
                              out=tmp_path / "ab.json", before_shared_session=True)
    report = load_test.main_soak_ab(a)
    assert sessions == [(False, False), (True, True), (True, True), (False, False)]     # (after?, own session)
    assert "beside its clients" in report["before"]["app_session"]
    assert "its own" in report["after"]["app_session"]


def test_the_app_runs_in_a_session_of_its_own_unless_told_not_to(tmp_path):
    """harness.localhost.running_app: the app is its own session (its own CPU group where the kernel groups by
    session), as a served app is; own_session=False keeps it in the caller's."""
    import urllib.request
    from harness.localhost import running_app
    (tmp_path / "app.py").write_text(
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = str(os.getsid(0)).encode()\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "http.server.HTTPServer(('127.0.0.1', int(os.environ['GRADIO_SERVER_PORT'])), H).serve_forever()\n")
    for own, same in ((True, False), (False, True)):
        with running_app(root=tmp_path, startup_timeout_s=30, own_session=own) as url:
            sid = int(urllib.request.urlopen(url, timeout=5).read())
        assert (sid == os.getsid(0)) is same, (own, sid, os.getsid(0))


def test_before_without_soak_or_with_no_pairs_is_refused_by_name():
    for argv in (["--before", "HEAD"], ["--soak", "--before", "HEAD", "--pairs", "0"],
                 ["--soak", "--before-shared-session"]):
        with pytest.raises(SystemExit):
            load_test.main(argv)


def test_the_servers_memory_is_split_by_the_process_holding_it():
    """family_rss_by_role: the server's own RSS, its drawing process's (by its command line) and every other
    child's as the export browser's; together family_rss_bytes."""
    import os
    import subprocess
    import sys
    import time
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "server.drawing_process"]),
                subprocess.Popen(["sleep", "30"])]
    try:
        time.sleep(0.5)
        roles = load_test.family_rss_by_role(os.getpid())
        assert abs(roles["server"] - load_test.rss_bytes(os.getpid())) < 16 * 2**20       # read twice: it moves
        assert roles["drawing"] >= load_test.rss_bytes(children[0].pid) > 0
        assert roles["browser"] >= load_test.rss_bytes(children[1].pid) > 0
        assert abs(sum(roles.values()) - load_test.family_rss_bytes(os.getpid())) < 64 * 2**20
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_the_servers_cpu_is_split_by_the_process_using_it():
    """RssSampler.cpu: a busy child named as the drawing process counts as drawing_process_s, a busy other child
    as export_browser_s, an idle one as neither, and this process (the "server", idle here) as server_s: the
    soak's record no longer files the drawing process's CPU under the export browser."""
    import os
    import subprocess
    import sys
    import time
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\ntime.sleep(30)"
    sampler = load_test.RssSampler(os.getpid())
    sampler.start()                     # first: the children, started after, count from their first second
    children = [subprocess.Popen([sys.executable, "-c", busy, "server.drawing_process"]),
                subprocess.Popen([sys.executable, "-c", busy]),
                subprocess.Popen(["sleep", "30"])]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(                 # both busy loops done, read after
                load_test.cpu_seconds(p.pid) >= 1.5 for p in children[:2]):
            time.sleep(0.2)
        time.sleep(1.5)
        sampler.stop()
        cpu = sampler.cpu
        assert 1.4 <= cpu["drawing_process_s"] <= 2.5, cpu
        assert 1.4 <= cpu["export_browser_s"] <= 2.5, cpu
        assert cpu["server_s"] < 1.0, cpu
    finally:
        for child in children:
            child.kill()
            child.wait()


@pytest.mark.skipif(not hasattr(os, "setpriority") or not Path("/proc/self/task").is_dir(),
                    reason="per-thread priority and /proc are Linux's")
def test_the_servers_low_priority_threads_cpu_is_counted_apart():
    """RssSampler.cpu: a thread of the server at nice 19 that burns ~1 s counts in server_low_priority_s, one at
    the normal priority that burns as long does not; both count in server_s."""
    import threading
    import time
    sampler = load_test.RssSampler(os.getpid())
    sampler.start()
    time.sleep(0.3)

    def burn(nice):
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        t = time.thread_time()
        while time.thread_time() - t < 1.0:
            pass
        time.sleep(2.5)             # alive while the sampler reads it once more (once a second)

    workers = [threading.Thread(target=burn, args=(nice,)) for nice in (19, 0)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sampler.stop()
    cpu = sampler.cpu
    assert 0.9 <= cpu["server_low_priority_s"] <= 1.5, cpu
    assert cpu["server_s"] >= 1.9, cpu


def test_an_attack_must_be_refused_once_past_its_bound_and_not_before():
    """The soak's attacker check: a GET flood that sent no more than the page-load rate answers (burst and rate
    over the run) was never past it; one that sent more and was refused nothing fails the check, as does an
    attack whose lane refuses within its first requests and was refused nothing."""
    from server import front_door
    flood, lane = load_test.Attack.GET_FLOOD, load_test.Attack.ONE_SESSION_FLOOD
    bound = front_door.PAGE_RATE["burst"] + front_door.PAGE_RATE["per_s"] * 90
    within, past = dict(requests=int(bound), refused_by_name=0), dict(requests=int(bound) + 1, refused_by_name=0)
    assert load_test.refused_past_bound(flood, within, 90.0)
    assert not load_test.refused_past_bound(flood, past, 90.0)
    assert load_test.refused_past_bound(flood, dict(past, refused_by_name=1), 90.0)
    assert not load_test.refused_past_bound(lane, dict(requests=3, refused_by_name=0), 90.0)
    assert load_test.refused_past_bound(lane, dict(requests=3, refused_by_name=2), 90.0)
    # mode 4's phoenix-nano uploads: its visitor's share of the store holds a few
    assert 1 <= load_test.answered_within_bound(load_test.Attack.UPLOAD_STORE, 90.0) <= 8
    assert load_test.answered_within_bound(load_test.Attack.HEAVY_WORK, 90.0) == 5       # 5 x 555 of 3,000 GFLOP


def test_a_soak_clients_connection_error_says_whether_its_connection_was_kept_and_how_long_idle():
    """A server that answers once on a kept-alive connection, then closes it without answering the next request
    (the shape of a keep-alive close racing the client's send): the error names the kept connection and its
    idle time; a refused new connection is named as new."""
    import socket
    import threading
    import time
    import httpx
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            conn.recv(65536)                    # the second request on the same connection: read, not answered
    threading.Thread(target=serve, daemon=True).start()
    raw = load_test.RawClient(f"http://127.0.0.1:{port}/", "10.9.9.1", fn={})
    assert raw.get("").status_code == 200
    time.sleep(0.3)
    with pytest.raises(httpx.RemoteProtocolError) as kept:
        raw.get("")
    assert "on a kept connection, sent 0.3" in str(kept.value) and "disconnected" in str(kept.value), kept.value
    listener.close()
    with pytest.raises(httpx.ConnectError) as new:
        raw.get("")
    assert "on a new connection" in str(new.value), new.value
