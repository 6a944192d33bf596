"""Uploaded weights belong to the visitor who uploaded them: never listed to or usable by another
session, never evicted by another session's uploads, forgotten after a while, bounded in bytes, and
held to the geometry they were checked against (a change of num_layers is answered by name)."""
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from explorer import budget, runs
from explorer.query_string import parse_query
from explorer.schema import ValidationError
from models.recsys import RecsysModel, init_recsys
from models.weights import flatten, save_weights
from server import uploads
from tolerances import assert_bit_exact

LECTURE = "preset=lecture&weights=random"


@pytest.fixture(autouse=True)
def empty_store(monkeypatch, tmp_path):
    monkeypatch.setattr(runs, "upload_state", uploads.state_of)       # what app.build_app sets at start-up
    (tmp_path / "store").mkdir()
    monkeypatch.setattr(uploads, "_STORE", tmp_path / "store")
    monkeypatch.setattr(uploads, "_UPLOADS", {})
    monkeypatch.setattr(uploads, "_GONE", {})
    monkeypatch.setattr(uploads, "_FORGOTTEN", {})


def weight_file(tmp_path, query=LECTURE, seed=1):
    model = init_recsys(RecsysModel(parse_query(query).recsys_config()), "random", seed)
    path = tmp_path / f"w{seed}.npz"
    save_weights(model, path)
    return path, model


def test_an_upload_is_its_sessions_alone(tmp_path):
    path, model = weight_file(tmp_path)
    name = uploads.load_upload(parse_query(LECTURE), str(path), "alice")
    assert set(uploads.uploads("alice")) == {name} and uploads.uploads("bob") == {}
    query = LECTURE.replace("random", f"upload:{name}")
    s = parse_query(query, uploaded=uploads.uploads("alice"))
    served = runs.build_model(s)
    for a, b in zip(served.state_dict().values(), model.state_dict().values()):
        assert_bit_exact(a, b, "no rounding")
    with pytest.raises(ValidationError, match=f"weights: got 'upload:{name}'; allowed: random"):
        parse_query(query, uploaded=uploads.uploads("bob"))


def test_an_upload_is_kept_on_disk_and_read_back_memory_mapped(tmp_path):
    """The store keeps each name's checked state in one file of its own directory, not in the server's
    memory: a model built from it reads the file's bits memory-mapped (the mapping shows in /proc/self/maps
    while the tensors live), and the file goes when no session holds the name any more."""
    path, model = weight_file(tmp_path)
    name = uploads.load_upload(parse_query(LECTURE), str(path), "alice")
    uploads.load_upload(parse_query(LECTURE), str(path), "bob")         # the same file: one copy on disk
    stored = uploads.store_dir() / f"{name}.pt"
    assert sorted(p.name for p in uploads.store_dir().iterdir()) == [stored.name]
    state = uploads.state_of(f"upload:{name}")
    assert str(stored) in Path("/proc/self/maps").read_text()
    for (k, a), (j, b) in zip(state.items(), model.state_dict().items()):
        assert k == j and a.dtype == torch.float32
        assert_bit_exact(a, b, "no rounding", k)       # the file holds the checked fp32 state
    del state
    uploads._forget("alice", "a test")
    assert stored.exists()                              # bob still holds the name
    uploads._forget("bob", "a test")
    assert list(uploads.store_dir().iterdir()) == []


def test_a_new_store_removes_the_stores_of_servers_no_longer_alive(tmp_path, monkeypatch):
    """A server killed (not stopped) cannot remove its directory: the next one made removes it, and keeps a
    live process's."""
    monkeypatch.setattr(uploads.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(uploads, "_STORE", None)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{uploads.STORE_PREFIX}{int(ended.stdout)}-abc"
    alive = tmp_path / f"{uploads.STORE_PREFIX}1-abc"                  # init: always running
    for d in (dead, alive):
        d.mkdir()
        (d / "0123456789abcdef.pt").write_bytes(b"weights")
    made = uploads.store_dir()
    assert made.parent == tmp_path and made.name.startswith(f"{uploads.STORE_PREFIX}{uploads.os.getpid()}-")
    assert not dead.exists() and alive.exists()


def test_a_store_cleared_under_the_server_forgets_the_upload_by_name(tmp_path):
    path = weight_file(tmp_path)[0]
    name = uploads.load_upload(parse_query(LECTURE), str(path), "alice")
    (uploads.store_dir() / f"{name}.pt").unlink()       # e.g. the machine's /tmp cleaned
    with pytest.raises(ValidationError, match="upload it again"):
        uploads.state_of(f"upload:{name}")
    assert uploads.uploads("alice") == {}
    assert uploads.forgotten("alice", name) == "when the server's store of uploads was cleared"


def test_a_disk_without_room_refuses_the_upload_by_name(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(uploads.torch, "save", full)
    with pytest.raises(ValidationError, match=r"weights file: got '[\d,]+ bytes of weights'; allowed: room on "
                                              r"the server's disk \(No space left on device\)"):
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path)[0]), "alice")
    assert uploads.uploads("alice") == {} and list(uploads.store_dir().iterdir()) == []


def test_one_sessions_uploads_never_evict_anothers(tmp_path):
    alice = uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=1)[0]), "alice")
    bob = [uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=s)[0]), "bob") for s in (2, 3, 4, 5)]
    assert set(uploads.uploads("alice")) == {alice}
    assert list(uploads.uploads("bob")) == bob[-uploads.UPLOADS_PER_SESSION:]      # bob's own oldest went


def test_a_full_store_refuses_by_name_and_keeps_what_it_holds(tmp_path, monkeypatch):
    path = weight_file(tmp_path, seed=1)[0]
    name = uploads.load_upload(parse_query(LECTURE), str(path), "alice")
    held = uploads._UPLOADS["alice"][name].nbytes
    monkeypatch.setattr(uploads, "MAX_UPLOAD_STORE_BYTES", held + held // 2)
    with pytest.raises(ValidationError, match=r"weights file: got '[\d,]+ bytes of weights'; allowed: room in "
                                              r"the server's upload store"):
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=2)[0]), "bob")
    assert set(uploads.uploads("alice")) == {name} and uploads.uploads("bob") == {}
    # at its own limit a session's new upload takes the place of its oldest, also in a full store
    monkeypatch.setattr(uploads, "UPLOADS_PER_SESSION", 1)
    newer = uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=3)[0]), "alice")
    assert set(uploads.uploads("alice")) == {newer} != {name}


def test_uploads_expire_from_their_upload_and_closing_the_page_forgets_them(tmp_path, monkeypatch):
    """An upload goes UPLOAD_TTL_S after it was uploaded: using it renews nothing (any request of its session
    asks), uploading it again does."""
    path = weight_file(tmp_path)[0]
    uploads.load_upload(parse_query(LECTURE), str(path), "alice")
    uploads.load_upload(parse_query(LECTURE), str(path), "bob")
    clock = [uploads.time.monotonic()]
    monkeypatch.setattr(uploads.time, "monotonic", lambda: clock[0])
    clock[0] += uploads.UPLOAD_TTL_S / 2
    assert uploads.uploads("alice")                     # used half way through its time
    uploads.load_upload(parse_query(LECTURE), str(path), "bob")       # uploaded again: its time starts again
    clock[0] += uploads.UPLOAD_TTL_S * 0.75
    assert uploads.uploads("alice") == {} and uploads.uploads("bob")
    uploads.page_gone("bob")
    clock[0] += uploads.PAGE_GONE_GRACE_S + 1
    uploads._expire_uploads(clock[0])
    assert uploads._UPLOADS == {}
    assert list(uploads.store_dir().iterdir()) == []          # and their file with them


def test_one_visitors_sessions_share_one_part_of_the_store(tmp_path, monkeypatch):
    """The sessions of one visitor key hold at most UPLOAD_SHARE_BYTES of the store together, so one
    client's many sessions cannot refuse everyone else's uploads."""
    path = weight_file(tmp_path)[0]
    uploads.load_upload(parse_query(LECTURE), str(path), "probe", "addr:x")
    size = next(iter(uploads._UPLOADS["probe"].values())).nbytes
    uploads._UPLOADS.clear()
    monkeypatch.setattr(uploads, "UPLOAD_SHARE_BYTES", 2 * size)
    monkeypatch.setattr(uploads, "MAX_UPLOAD_STORE_BYTES", 6 * size)
    for i in range(2):
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=i + 1)[0]), f"minted-{i}", "addr:a")
    with pytest.raises(ValidationError, match=r"^weights file: got .* bytes of weights held by your uploads'; "
                                              r"allowed: .* bytes per visitor"):
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=3)[0]), "minted-2", "addr:a")
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=4)[0]), "someone", "addr:b")
    assert uploads.uploads("someone")


def test_a_closed_page_keeps_its_uploads_for_a_grace_period_and_says_when_they_went(tmp_path, monkeypatch):
    """Uploads go PAGE_GONE_GRACE_S after the page left (a dropped heartbeat is not a closed page), any
    request of the session brings it back, and a later use names what happened."""
    from server import guard
    name = uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path)[0]), "alice")
    clock = [uploads.time.monotonic()]
    monkeypatch.setattr(uploads.time, "monotonic", lambda: clock[0])
    uploads.page_gone("alice")                              # a blip: the page comes back
    clock[0] += uploads.PAGE_GONE_GRACE_S / 2
    assert name in uploads.uploads("alice")
    clock[0] += uploads.PAGE_GONE_GRACE_S * 0.9             # back within the grace: not gone
    assert name in uploads.uploads("alice")
    uploads.page_gone("alice")
    clock[0] += uploads.PAGE_GONE_GRACE_S + 1
    page = type("Request", (), {"session_hash": "alice"})()
    with pytest.raises(ValidationError, match=r"weights: got 'upload:\w+'; allowed: an upload the server still "
                                              r"holds: these weights were forgotten 10 minutes after the page was "
                                              r"closed; upload the file again"):
        guard.settings_of(LECTURE.replace("random", f"upload:{name}"), page)


def test_a_geometry_change_with_uploaded_weights_is_answered_by_name(tmp_path):
    name = uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path)[0]), "alice")
    query = LECTURE.replace("random", f"upload:{name}")
    for change, message in (("num_layers=3", "are for num_layers=2 (here num_layers=3)"),
                            ("emb_size=32&num_layers=1", "for emb_size=64, num_layers=2 (here emb_size=32, "
                                                         "num_layers=1)"),
                            ("widening_factor=2", "widening_factor=4 (here widening_factor=2.0)")):
        with pytest.raises(ValidationError, match=f"weights: got 'upload:{name}'; allowed: these uploaded "
                                                  f"weights .*{re.escape(message)}"):
            parse_query(f"{query}&{change}", uploaded=uploads.uploads("alice"))
    # what does not shape the weights may change
    parse_query(f"{query}&num_candidates=5&rope_mode=shared", uploaded=uploads.uploads("alice"))


# --- production's (2026) weights: its stacked names, the same checks and the same scope ------------------

XREX = ("preset=phoenix-2026-seqpack&emb_size=32&num_layers=2&key_size=8&num_q_heads=4&num_kv_heads=2&"
        "num_history=6&history_padding=2&num_candidates=4&candidate_padding=1")


def xrex_file(tmp_path, query=XREX, seed=1, dtype=None, name="x.safetensors"):
    """A file saved from a random XrexRanker (models.weights.save_weights: production's flattened names)."""
    from models.xrex import XrexRanker, init_xrex
    ranker = init_xrex(XrexRanker(parse_query(query).xrex_config()), seed)
    if dtype is not None:
        ranker = ranker.to(dtype)
    path = tmp_path / name
    save_weights(ranker, path)
    return path, ranker.float()


def test_production_weights_upload_into_the_xrex_family_and_serve_its_own_forward(tmp_path):
    path, ranker = xrex_file(tmp_path)
    name = uploads.load_upload(parse_query(XREX), str(path), "alice")
    s = parse_query(f"{XREX}&weights=upload:{name}", uploaded=uploads.uploads("alice"))
    served = runs.build_model(s).ranker
    for a, b in zip(served.state_dict().values(), ranker.state_dict().values()):
        assert_bit_exact(a, b, "no rounding")
    out = runs.forward(s)
    with torch.no_grad():
        own = ranker(out.embeddings, out.valid)
    assert_bit_exact(out.logits, own.logits, "same computation")
    with pytest.raises(ValidationError, match=f"weights: got 'upload:{name}'; allowed: random"):
        parse_query(f"{XREX}&weights=upload:{name}", uploaded=uploads.uploads("bob"))
    with pytest.raises(ValidationError, match=r"are for num_layers=2 \(here num_layers=1\)"):
        parse_query(f"{XREX}&weights=upload:{name}&num_layers=1", uploaded=uploads.uploads("alice"))


def test_a_file_of_the_other_family_is_refused_by_name(tmp_path):
    grok_path, _ = weight_file(tmp_path)
    with pytest.raises(ValidationError, match=r"weights file: got 'w1.npz'; allowed: weights of the model family "
                                              r"chosen, production \(2026\): this file holds grok.py's per-layer "
                                              r"names .* choose the family grok.py \(2025 open source\) first"):
        uploads.load_upload(parse_query(XREX), str(grok_path), "alice")
    xrex_path, _ = xrex_file(tmp_path)
    with pytest.raises(ValidationError, match=r"weights file: got 'x.safetensors'; allowed: weights of the model "
                                              r"family chosen, grok.py .* holds production's stacked names"):
        uploads.load_upload(parse_query(LECTURE), str(xrex_path), "alice")
    assert uploads.uploads("alice") == {}


def test_production_uploads_get_grok_uploads_checks(tmp_path):
    """Shapes against the configuration by name, values after the cast to fp32, any float dtype."""
    small, _ = xrex_file(tmp_path, XREX.replace("emb_size=32", "emb_size=16"), name="small.safetensors")
    with pytest.raises(ValidationError, match=r"(?s)weights file: got 'small.safetensors'; allowed: weights that match "
                                              r"the configuration.*qkv/w has shape \[2, 16, 64\], expected \[2, 32, 64\]"):
        uploads.load_upload(parse_query(XREX), str(small), "alice")
    from safetensors.numpy import save_file
    from models.weights import flatten, haiku_params
    _, ranker = xrex_file(tmp_path)
    flat = flatten(haiku_params(ranker))
    flat["transformer/layer_stack/decoder_layer_0/up_proj/w"][1, 0, 0] = 1e30
    save_file(flat, str(tmp_path / "huge.safetensors"))
    with pytest.raises(ValidationError, match=r"up_proj/w has a value of magnitude 1e\+30; allowed: at most 1e\+04"):
        uploads.load_upload(parse_query(XREX), str(tmp_path / "huge.safetensors"), "alice")
    half, ranker16 = xrex_file(tmp_path, dtype=torch.bfloat16, name="bf16.safetensors")
    name = uploads.load_upload(parse_query(XREX), str(half), "alice")
    served = runs.build_model(parse_query(f"{XREX}&weights=upload:{name}", uploaded=uploads.uploads("alice"))).ranker
    for a, b in zip(served.state_dict().values(), ranker16.state_dict().values()):
        assert_bit_exact(a, b, "no rounding")


# --- round three: the share checked before any work, a reload keeps its uploads, memory counted ---------

def test_an_upload_past_the_share_is_refused_before_its_model_is_built(tmp_path, monkeypatch):
    """The visitor's share and the store are checked against the size the geometry implies before the
    model is built (2 s for a 40M-parameter one): a refused upload costs a lookup."""
    path = weight_file(tmp_path)[0]
    monkeypatch.setattr(uploads, "UPLOAD_SHARE_BYTES", 1000)
    built = []
    monkeypatch.setattr(runs, "_initialised", lambda s: built.append(s))
    with pytest.raises(ValidationError, match=r"^weights file: got '[\d,]+ bytes of weights held by your uploads'"):
        uploads.load_upload(parse_query(LECTURE), str(path), "alice", "addr:a")
    assert built == []


def test_building_an_upload_holds_its_memory(tmp_path, monkeypatch):
    seen = []
    real = runs._initialised
    monkeypatch.setattr(runs, "_initialised", lambda s, **kw: seen.append(budget.MEMORY.reserved) or real(s, **kw))
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path)[0]), "alice", "addr:a")
    assert seen and seen[0] >= 2 * 4 * runs.estimate_params(parse_query(LECTURE))


def test_a_reloaded_page_takes_its_uploads_over_and_nobody_elses(tmp_path):
    """A reload is a new session hash and the old page gone: the page opened on a link naming the upload takes
    it over (no second copy counted against the share); another visitor, or a page still open, keeps its own."""
    name = uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path)[0]), "before-reload", "addr:a")
    assert not uploads.adopt("after-reload", "addr:a", name)          # the first page is still open
    uploads.page_gone("before-reload")
    assert not uploads.adopt("stranger", "addr:b", name)              # another visitor's closed page
    assert uploads.adopt("after-reload", "addr:a", name)
    assert name in uploads.uploads("after-reload") and "before-reload" not in uploads._UPLOADS


def test_a_reloaded_browsers_closed_page_makes_room_and_a_classmates_keeps_its_grace(tmp_path, monkeypatch):
    """Two students behind one address: one's page lost its connection (closed), the other uploads: the first
    keeps its weights for the grace period. A page reloaded in the same browser (its signed cookie) without the
    link makes room by dropping its own closed page's uploads."""
    path = weight_file(tmp_path)[0]
    uploads.load_upload(parse_query(LECTURE), str(path), "probe", "addr:x")
    size = next(iter(uploads._UPLOADS.pop("probe").values())).nbytes
    monkeypatch.setattr(uploads, "UPLOAD_SHARE_BYTES", 3 * size)
    first = uploads.load_upload(parse_query(LECTURE), str(path), "student-1", "addr:a", browser="b1")
    uploads.page_gone("student-1")                              # a dropped connection
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=2)[0]), "student-2", "addr:a", browser="b2")
    assert first in uploads.uploads("student-1")                # back within the grace: still there
    uploads.page_gone("student-1")
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=3)[0]), "student-1-reloaded", "addr:a",
                        browser="b1")
    assert "student-1" not in uploads._UPLOADS and "student-2" in uploads._UPLOADS
    assert uploads.forgotten("student-1", first) == "when your reloaded page uploaded again"


def test_a_full_store_makes_room_from_the_heaviest_network_only_for_a_lighter_one(tmp_path, monkeypatch):
    """Three addresses of one network fill the store: an honest upload from elsewhere is taken (their oldest
    goes, and their session is told why), and they cannot push each other's or the honest one's out; a network
    holds at most NETWORK_SHARE_BYTES."""
    path = weight_file(tmp_path)[0]
    uploads.load_upload(parse_query(LECTURE), str(path), "probe", "addr:x")
    size = next(iter(uploads._UPLOADS.pop("probe").values())).nbytes
    monkeypatch.setattr(uploads, "MAX_UPLOAD_STORE_BYTES", 4 * size)
    monkeypatch.setattr(uploads, "NETWORK_SHARE_BYTES", 3 * size)
    monkeypatch.setattr(uploads, "UPLOAD_SHARE_BYTES", 2 * size)
    names = [uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=10 + i)[0]), f"bot-{i}",
                                 f"addr:198.51.100.{i}") for i in range(3)]
    with pytest.raises(ValidationError, match=r"bytes of weights held by uploads from your net.*; allowed: .* "
                                              r"bytes per network"):
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=20)[0]), "bot-3", "addr:198.51.100.3")
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=21)[0]), "honest-1", "addr:203.0.113.1")
    assert uploads.store_bytes() == 4 * size
    uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=22)[0]), "honest-2", "addr:192.0.2.1")
    assert uploads.uploads("bot-0") == {} and all(uploads.uploads(f"bot-{i}") for i in (1, 2))
    assert uploads.forgotten("bot-0", names[0]) == "when the store needed room for a lighter network's upload"
    assert uploads.uploads("honest-1") and uploads.uploads("honest-2") and uploads.store_bytes() == 4 * size
    with pytest.raises(ValidationError, match="room in the server's upload store"):     # 2 each: no heavier
        uploads.load_upload(parse_query(LECTURE), str(weight_file(tmp_path, seed=23)[0]), "honest-3", "addr:192.0.2.9")


def test_importing_the_store_changes_nothing_below_it():
    """explorer.runs takes uploads only from the hook the app sets at start-up (runs.serve_uploads), never
    from an import's side effect."""
    code = ("import server.uploads, explorer.runs as r; from explorer.runs import _no_uploads; "
            "print(r.upload_state is _no_uploads)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


@pytest.mark.parametrize("query", [LECTURE, LECTURE + "&num_layers=3&emb_size=24&seed=5"])
@pytest.mark.parametrize("hash_tables", [True, False])
def test_an_upload_check_gives_the_weights_a_fully_seeded_model_gives_after_the_same_load(tmp_path, query, hash_tables):
    """The upload check draws only grok.py's hash tables (the file writes every other parameter): its state is
    bit-for-bit the state of a model seeded in full and loaded from the same file, whether the file carries
    its own tables or keeps the seeded ones."""
    from models.weights import haiku_params, load_weights
    s = parse_query(query)
    source = init_recsys(RecsysModel(s.recsys_config()), "random", 7)
    path = tmp_path / "w.npz"
    np.savez(path, **flatten(haiku_params(source, hash_tables=hash_tables)))
    _, state = runs.check_upload(s, str(path))
    expected = load_weights(runs._initialised(replace(s, weights="random")), path).state_dict()
    assert state.keys() == expected.keys()
    for k in state:
        assert_bit_exact(state[k], expected[k], "no rounding", what=k)     # one file's copy, or one generator's
    seeded = init_recsys(RecsysModel(s.recsys_config()), "random", s.seed)
    assert_bit_exact(state["post_embeddings.weight"], (source if hash_tables else seeded).post_embeddings.weight,
                     "no rounding")
