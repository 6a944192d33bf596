"""The app through gradio_client, launched on localhost: every named endpoint answers correctly, bad
input comes back as an error naming the field, and the server keeps serving afterwards."""
import json
import os
import re
import time
import urllib.error
import urllib.request
from unittest import mock
from urllib.parse import parse_qs

import gradio as gr
import numpy as np
import pytest
import torch

from explorer.views import VIEWS, drawn_views, variant_training_report
from harness.localhost import running_app
from served import array, plot_data
from tolerances import randn_attention_abs_bound, relative_error, rounding_bound

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

pytestmark = pytest.mark.slow

LECTURE = "preset=lecture&weights=random"


VIEW_APIS = tuple(v.name for v in drawn_views())          # one endpoint per drawn view of explorer.views.VIEWS
DOCUMENTED = {f"/{name}" for name in VIEW_APIS} | {
    "/settings", "/control_change", "/preset", "/family", "/timing", "/stop_timing", "/export_figure", "/lecture_pack",
    "/upload_weights"}


def test_the_api_page_lists_only_the_documented_endpoints(client):
    """The page's own steps (render_after_*, sync_*, write_url_*, tab_*) stay callable but unlisted."""
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])  # noqa
    assert names == DOCUMENTED
    readme = open("README.md").read()
    assert all(f"`{name}`" in readme for name in DOCUMENTED)


def test_a_preset_too_large_for_the_device_draws_its_mask_and_names_the_limit(client):
    """phoenix-prod on a CPU: offered, accepted, its mask drawn; model views say why not, by field."""
    assert client.predict("phoenix-prod", api_name="/preset") == "preset=phoenix-prod"
    fig, text, *_ = client.predict("preset=phoenix-prod", api_name="/mask")
    assert [t for t in plot_data(fig) if t["type"] == "heatmap"] and "| recsys |" in text
    with pytest.raises(AppError, match=r"emb_size: got 2560; allowed: .*needs a GPU"):
        client.predict("preset=phoenix-prod", api_name="/attention")
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import all_values
    s = parse_query("preset=phoenix-prod", need_model=False)
    out = client.predict(*list(all_values(s).values()), "attention", "preset=lecture",
                         api_name="/render_on_change")
    query, note = out[:2]                            # (the list of marked controls is page state)
    attention_text = out[2 + len(CONTROL_FIELDS) + 4 + 2]        # after the mask tab's 4 outputs
    assert query == "preset=phoenix-prod" and "does not fit" in note and "emb_size" in note
    assert "does not fit" in attention_text


def test_an_invalid_control_is_marked_and_the_others_keep_working(client):
    """lecture -> query heads 8 (locked by the demo weights) -> RoPE offset 100: the offset still redraws,
    the heads box carries the message, and the link keeps the last valid heads."""
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import all_values
    names = CONTROL_FIELDS
    s = parse_query("preset=lecture&head=0")
    values = [all_values(s)[n] for n in names]
    values[names.index("num_q_heads")] = 8
    out = client.predict(*values, "attention", "preset=lecture&head=0", api_name="/render_on_change")
    query, heads_box = out[0], out[2 + names.index("num_q_heads")]
    assert query == "preset=lecture&head=0"
    assert "query heads: got 8" in heads_box["info"] and "invalid" in heads_box["elem_classes"]
    weights_box = out[2 + names.index("weights")]                   # the demo weights lock the geometry: marked too
    assert "trained demo weights" in weights_box["info"] and "invalid" in weights_box["elem_classes"]
    assert "last valid settings" in out[1]
    values[names.index("rope_offset")] = 100
    out = client.predict(*values, "attention", query, api_name="/render_on_change")
    assert out[0] == "preset=lecture&rope_offset=100&head=0"
    attn_fig = out[2 + len(names) + 4]
    assert "query head 0" in json.loads(attn_fig["plot"])["layout"]["title"]["text"]
    values[names.index("num_q_heads")] = 4                          # fixed: the mark goes
    out = client.predict(*values, "attention", out[0], api_name="/render_on_change")
    assert out[0] == "preset=lecture&rope_offset=100&head=0"


def test_mask_endpoint_draws_the_layout(client):
    fig, text, kernels, kernel_text = client.predict(LECTURE + "&num_history=3&num_candidates=2", api_name="/mask")
    hm = [t for t in plot_data(fig) if t["type"] == "heatmap"]
    assert len(hm) == 2 and hm[0]["x"] == ["U", "H0", "H1", "H2", "C0", "C1"]
    assert "| recsys |" in text
    assert len([t for t in plot_data(kernels) if t["type"] == "heatmap"]) == 4     # element mask + 3 kernels
    assert "| fa4 | 128×128 |" in kernel_text


def test_attention_endpoint_returns_the_models_probabilities(client):
    fig, bars, text = client.predict(LECTURE + "&head=1", api_name="/attention")
    z = array(plot_data(fig)[0]["z"])
    assert z.shape == (9, 9)
    assert np.abs(z.sum(-1) - 1).max() <= rounding_bound(torch.float32, 9)   # rows of fp32 probabilities
    assert np.triu(z[:6, :6], 1).max() == 0.0                       # causal prefix
    assert "Query **C0**" in text


def test_isolation_endpoint_verdict(client):
    _, _, text = client.predict(LECTURE + "&candidate=1&perturbation=noise&delta=5", api_name="/isolation")
    first, second = text.split("\n\n")[:2]
    assert "recsys: isolated — largest change on any other candidate: residual stream 0, logits 0" in first
    assert "causal" in second and "NOT isolated" in second


def test_invariance_endpoint(client):
    _, text, angles, qk, rope_text = client.predict(LECTURE + "&rope_mode=shared", api_name="/invariance")
    assert "sequential" in text and "(moves)" in text and "shared" in text and "invariant" in text
    assert "q·k depends only on the distance" in rope_text


@pytest.mark.parametrize("query", ["preset=lecture&operation=add",                    # a new candidate
                                   "preset=lecture&num_candidates=1&operation=drop"])  # drop the only one
def test_invariance_repros_answer_without_an_internal_error(client, query):
    _, text, _, _, _ = client.predict(query, api_name="/invariance")
    assert "Largest score change" in text or "leaves no candidate" in text


def test_variants_endpoint(client):
    var_fig, loss_fig, var_text, bug_fig, bug_text = client.predict(LECTURE + "&variant=mla&bug=exact-gelu",
                                                                    api_name="/variants")
    assert "**mla**" in var_text and "| **exact-gelu** |" in bug_text
    assert [t for t in plot_data(var_fig) if t["type"] == "heatmap"]
    assert len([t for t in plot_data(loss_fig) if t["type"] == "scatter"]) == len(
        variant_training_report()["variants"])                          # one training curve per variant


def test_settings_and_preset_endpoints_write_the_query(client):
    assert client.predict("phoenix-nano", api_name="/preset") == "preset=phoenix-nano"
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import all_values
    s = parse_query(LECTURE + "&num_candidates=5&head=2")
    values = list(all_values(s).values())
    q = client.predict(*values, api_name="/settings")
    assert parse_query(q) == s


def test_timing_endpoint_measures_and_labels_the_device(client):
    time_fig, mem_fig, speed_fig, err_fig, flash_fig, note = client.predict(
        LECTURE, "16, 32", ["naive", "structured"], api_name="/timing")
    live = {t["meta"].split(" · ")[0]: t for t in plot_data(time_fig) if "measured now" in t.get("meta", "")}
    assert set(live) == {"naive", "structured"} and list(array(live["naive"]["x"])) == [16, 32]
    assert array(plot_data(err_fig)[1]["y"]).max() <= randn_attention_abs_bound(32)
    assert "Measured now on" in note and "5 interleaved repeats" in note and "Done: 2 lengths" in note
    assert "the sidebar's model: B = 1, 4 query heads sharing 2 KV heads" in note
    beside = {t["xaxis"]: t["meta"] for t in plot_data(flash_fig)}        # the GPU run beside, on its own axes
    assert beside["x"].startswith("recorded on NVIDIA") and beside["x2"].startswith("measured now on CPU")


def test_timing_refuses_a_backend_this_device_does_not_run_before_running(client):
    with pytest.raises(AppError, match="backends: got 'flash_attn'; allowed: .*needs CUDA"):
        client.predict(LECTURE, "16", ["naive", "flash_attn"], api_name="/timing")


def test_production_presets_time_and_export_on_a_cpu(client):
    """The defect: at phoenix-2026 on a CPU, Run left bare 'Error' badges and even the mask figure
    could not be exported. Attention shapes and masks need no model; the model's figures say why not."""
    from explorer.query_string import parse_query
    if torch.cuda.is_available():
        pytest.skip("on a GPU phoenix-2026's model fits")
    query = "preset=phoenix-2026"
    s = parse_query(query, need_model=False)
    *_, note = client.predict(query, str(s.num_candidates + 16), ["naive"], api_name="/timing")
    assert "Done: 1 lengths" in note and f"{s.num_q_heads} query heads" in note
    for name in ("mask", "kernels"):
        path = client.predict(query, name, "svg", api_name="/export_figure")
        assert os.path.basename(path).startswith(f"{name}-phoenix-2026") and open(path).read(4) == "<svg"
    with pytest.raises(AppError, match="emb_size: got"):
        client.predict(query, "attention", "png", api_name="/export_figure")


def test_opening_the_timing_tab_keeps_lengths_that_fit_and_replaces_those_that_do_not():
    from server import timing_events
    assert timing_events.timing_lengths_kept("preset=lecture", "model settings", "16, 32") == {"__type__": "update"}
    fixed = timing_events.timing_lengths_kept("preset=phoenix-2026", "model settings", "64, 128, 256, 512")["value"]
    assert fixed == "256, 512, 1024, 2048"          # phoenix-2026 holds 128 candidate slots: T > 128


def test_the_timing_message_names_what_run_measures_and_what_is_wrong():
    """Issue 35 item 7: after bfloat16 and the phoenix-prod shapes were chosen the tab still said "float32, the
    sidebar's model". The line under the controls now says what Run measures, as chosen; an emptied lengths box
    gets one message naming the field, and Run is disabled until it is mended."""
    from server import timing_events
    message, run = timing_events.timing_check("preset=lecture", "128, 256", ["naive", "flex"], "phoenix-prod",
                                                "bfloat16")
    assert "preset 'phoenix\\-prod'" in message and "bfloat16" in message and "float32" not in message
    assert "sidebar's model" not in message and run["interactive"] is True
    message, run = timing_events.timing_check("preset=lecture", "16", ["naive"], "model settings", "float32")
    assert "the sidebar's model" in message and "float32" in message and "T = 16 " in message
    message, run = timing_events.timing_check("preset=lecture", "", ["naive"], "model settings", "float32")
    assert message.startswith("**Cannot run:** lengths: got ''") and "the box is empty" in message
    assert run["interactive"] is False and message.count("Cannot run") == 1


def test_export_endpoint_png(client):
    path = client.predict(LECTURE, "mask", "png", api_name="/export_figure")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def make_weights(tmp_path, emb_size=64, seed=123):
    from models.presets import get_preset
    from models.recsys import RecsysModel, init_recsys
    from models.weights import save_weights
    cfg = get_preset("lecture").recsys_config(get_preset("lecture").transformer.replace(emb_size=emb_size))
    model = init_recsys(RecsysModel(cfg), "random", seed)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"w{emb_size}.safetensors"
    save_weights(model, path)
    return path, model


def test_upload_good_file_then_bad_file_keeps_weights(client, tmp_path):
    good, model = make_weights(tmp_path)
    q, msg = client.predict(LECTURE, handle_file(str(good)), api_name="/upload_weights")
    assert "weights=upload%3A" in q and "Loaded" in msg
    fig, _, _ = client.predict(q + "&head=0", api_name="/attention")
    assert np.isfinite(array(plot_data(fig)[0]["z"])).all()
    bad, _ = make_weights(tmp_path, emb_size=32)
    with pytest.raises(AppError, match="weights file.*emb_size|shape"):
        client.predict(q, handle_file(str(bad)), api_name="/upload_weights")
    again, _, _ = client.predict(q + "&head=0", api_name="/attention")   # the good upload still serves
    assert plot_data(again)[0]["z"] == plot_data(fig)[0]["z"]
    pickle = tmp_path / "w.pt"
    torch.save({"x": torch.zeros(1)}, pickle)
    with pytest.raises(AppError, match=r"never pickle|\.npz"):   # gradio or our own check refuses it
        client.predict(q, handle_file(str(pickle)), api_name="/upload_weights")


def test_uploads_belong_to_the_visitor_who_made_them(server, client, tmp_path):
    """Another visitor can neither list nor use them, and their uploads evict none of them."""
    good, _ = make_weights(tmp_path)
    q, _ = client.predict(LECTURE, handle_file(str(good)), api_name="/upload_weights")
    name = parse_qs(q)["weights"][0]
    mine = client.predict(q + "&head=0", api_name="/attention")[0]
    other = Client(server, verbose=False)
    with pytest.raises(AppError, match=f"weights: got '{name}'; allowed: random, zeros, demo"):
        other.predict(q, api_name="/attention")
    for seed in range(4):
        other_file, _ = make_weights(tmp_path / f"other{seed}", seed=seed)
        other.predict(LECTURE, handle_file(str(other_file)), api_name="/upload_weights")
    assert client.predict(q + "&head=0", api_name="/attention")[0] == mine


def test_a_geometry_change_with_uploaded_weights_names_their_geometry(client, tmp_path):
    good, _ = make_weights(tmp_path)
    q, _ = client.predict(LECTURE, handle_file(str(good)), api_name="/upload_weights")
    for api in ("/attention", "/isolation"):
        with pytest.raises(AppError, match=r"weights: got 'upload:\w+'; allowed: these uploaded weights are for "
                                           r"num_layers=2 \(here num_layers=3\)"):
            client.predict(q + "&num_layers=3", api_name=api)


def test_an_uploads_file_name_is_shown_as_text(client, tmp_path):
    """The file name is the uploader's text inside the Markdown message: no link can be made of it."""
    hostile = tmp_path / "[Sign in again](https-evil.example)_x_.safetensors"
    make_weights(tmp_path)[0].rename(hostile)
    _, msg = client.predict(LECTURE, handle_file(str(hostile)), api_name="/upload_weights")
    assert "](" not in msg and "Loaded \\[Sign in again\\]\\(https\\-evil\\.example\\)\\_x\\_" in msg, msg


def call_raw(server, api, payload) -> dict:
    """POST /gradio_api/call/<api> as any HTTP client can, then read the event stream's last message.
    An event refused when it is pushed (a lane's admission check cannot even read too few inputs)
    answers at once, HTTP 400 with the words in `detail`: returned as an error event too."""
    req = urllib.request.Request(f"{server}gradio_api/call/{api}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        event_id = json.loads(urllib.request.urlopen(req, timeout=30).read())["event_id"]
    except urllib.error.HTTPError as e:
        if e.code != 400:
            raise
        return {"event": "error", "error": json.loads(e.read())["detail"]}
    stream = urllib.request.urlopen(f"{server}gradio_api/call/{api}/{event_id}", timeout=120).read().decode()
    event, data = [line.split(": ", 1)[1] for line in stream.strip().splitlines()[-2:]]
    return {"event": event, **json.loads(data)} if event == "error" else {"event": event}


def test_too_few_arguments_are_answered_in_words_on_every_endpoint(server, client):
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    for api, e in endpoints.items():
        if e["parameters"]:
            answer = call_raw(server, api.lstrip("/"), {"data": []})
            assert answer["event"] == "error" and answer["error"], (api, answer)
            assert f"needed: {len(e['parameters'])}, got: 0" in answer["error"], (api, answer)


def test_a_file_without_gradios_marker_is_named(server):
    for value in ({"path": "/etc/passwd"}, {"path": "x.npz", "orig_name": "x.npz"}, {"url": "http://x"}):
        answer = call_raw(server, "upload_weights", {"data": ["preset=lecture", value]})
        assert answer["error"].startswith("weights file: got "), answer


@pytest.mark.parametrize("api,args,field", [
    ("/attention", ("preset=lecture&num_q_heads=3",), "num_q_heads"),
    ("/mask", ("preset=lecture&num_history=5000",), "num_history"),
    ("/isolation", ("preset=lecture&delta=nan",), "delta"),
    ("/invariance", ("x" * 5000,), "query string"),
    ("/timing", ("preset=lecture", "10, 99999", ["naive"]), "lengths"),
    ("/export_figure", ("preset=lecture&head=9", "mask", "png"), "head"),
])
def test_bad_input_is_a_clear_error_and_the_server_keeps_serving(client, api, args, field):
    with pytest.raises(AppError) as e:
        client.predict(*args, api_name=api)
    assert str(e.value).startswith(f"{field}: got") or f"{field}:" in str(e.value), str(e.value)
    assert "Traceback" not in str(e.value)
    fig = client.predict(LECTURE, api_name="/mask")[0]
    assert plot_data(fig)


def test_control_change_validates_and_redraws_only_the_visible_tab(client):
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import all_values
    s = parse_query(LECTURE + "&head=2&values=capped+logits")
    out = client.predict(*list(all_values(s).values()), "attention", api_name="/control_change")
    query, head, attn_fig = out[0], out[1], out[6]      # then mask fig + text, kernel fig + text, attention fig, ...
    assert parse_query(query) == s and head["value"] == 2 and len(head["choices"]) == 5
    assert "capped logits: layer 0, query head 2" in json.loads(attn_fig["plot"])["layout"]["title"]["text"]
    bad = list(all_values(s).values())
    bad[CONTROL_FIELDS.index("num_kv_heads")] = 3
    with pytest.raises(AppError, match="num_q_heads: got 4"):
        client.predict(*bad, "attention", api_name="/control_change")


FUZZ = ["", "x" * 10_000, "preset=lecture&num_history=-5", "preset=lecture&delta=1e400",
        "preset=lecture&seed=99999999999999", "preset=lecture&emb_size=NaN", "preset=lecture&head=%00",
        "preset=lecture&query=1e9", "&&&===", "preset=lecture&weights=upload:nothere"]


@pytest.mark.parametrize("api", [f"/{name}" for name in VIEW_APIS])
def test_fuzzed_queries_get_messages_and_the_server_stays_up(client, api):
    for bad in FUZZ:
        try:
            client.predict(bad, api_name=api)
        except AppError as e:
            assert ": got" in str(e) and "Traceback" not in str(e), (bad, str(e))
        else:
            assert bad in ("", "&&&==="), bad      # empty settings are the lecture defaults
    assert plot_data(client.predict(LECTURE, api_name="/mask")[0])


def test_fuzzed_timing_and_export_arguments(client):
    for lengths in ("nan", "-1", "1e9", "64," * 50, "a" * 5000):
        with pytest.raises(AppError, match="lengths: got"):
            client.predict(LECTURE, lengths, ["naive"], api_name="/timing")
    with pytest.raises(AppError):
        client.predict(LECTURE, "64", ["no-such-backend"], api_name="/timing")
    with pytest.raises(AppError, match="query string: got"):
        client.predict("y" * 5000, "mask", "png", api_name="/export_figure")
    assert plot_data(client.predict(LECTURE, api_name="/mask")[0])


def test_every_event_that_runs_the_model_shares_one_concurrency_limit():
    """Control changes, tab redraws and the view endpoints queue together: their forwards are capped
    as one group, not each event on its own default limit. The mask endpoint runs no model: it has its
    own lane, so it never waits behind four probe passes."""
    import app
    from server import lanes
    from server import admission
    fns = {fn.api_name: fn for fn in app.build_app().fns.values() if fn.api_name}
    assert (fns["mask"].concurrency_id, fns["mask"].concurrency_limit) == ("light", admission.LANES["light"].running)
    forward = {n for n in fns if n == "control_change" or n.startswith("render_")} | {
        "attention", "anatomy", "isolation", "invariance", "variants"}
    assert {(fns[n].concurrency_id, fns[n].concurrency_limit) for n in forward} == {
        (lanes.FORWARD["concurrency_id"], lanes.FORWARD["concurrency_limit"])}
    others = {fns[n].concurrency_id for n in fns if n not in forward}
    assert lanes.FORWARD["concurrency_id"] not in others


def test_every_event_reading_a_control_takes_its_value_as_sent():
    """Gradio's own preprocessing rounds 2.5 -> 2 and refuses an unknown choice without naming the field;
    every event that reads a number, dropdown, radio or checkbox control skips it (preprocess=False), so
    explorer.settings sees the value as sent (tests/test_api_fuzz.py checks the messages it gives)."""
    import app
    demo = app.build_app()
    reading = [fn for fn in demo.fns.values() if any(isinstance(b, app.CHECKED_BY_SETTINGS) for b in fn.inputs)]
    assert {fn.api_name for fn in reading} >= {"render_on_change", "control_change", "settings", "preset",
                                               "family", "timing", "export_figure", "lecture_pack"}
    assert [fn.api_name for fn in reading if fn.preprocess] == []


def test_the_weights_list_shows_only_this_visitors_uploads(tmp_path, monkeypatch):
    """In-process, with two visitors' requests: the dropdown each is sent lists their own uploads only."""
    from types import SimpleNamespace
    from server import endpoints, links, uploads
    monkeypatch.setattr(uploads, "_UPLOADS", {})
    alice, bob = SimpleNamespace(session_hash="alice"), SimpleNamespace(session_hash="bob")
    q, _ = endpoints.upload_endpoint(LECTURE, str(make_weights(tmp_path)[0]), alice)
    name = parse_qs(q)["weights"][0]

    def choices(request, query):
        weights = links.query_to_controls(query, request)[endpoints.CONTROL_FIELDS.index("weights")]
        return [value for _, value in weights["choices"]]
    assert name in choices(alice, q)
    assert choices(bob, LECTURE) == ["demo", "random", "zeros"]


# --- the timing sweep's lifetime: Stop, cancel and the one-at-a-time slot -------------------------

def consume(gen, outs):
    async def run():
        async for out in gen:
            outs.append(out)
    return run()


LONG_SWEEP = ("preset=lecture&weights=random&num_q_heads=16&num_kv_heads=16&key_size=64",
              "256, 512, 768, 1024, 1536, 2048", ["naive", "structured"])


def test_stop_then_run_again_stops_the_old_sweep_within_one_point():
    """Stop, then Run at once: each run has its own stop flag, so the new run's start cannot un-stop the
    earlier sweep before its thread sees the flag, and the two never run side by side."""
    import asyncio
    import time
    from types import SimpleNamespace

    from server import timing_events, timing_runs

    async def main():
        page = SimpleNamespace(session_hash="one-visitor")
        old_outs, new_outs = [], []
        old = asyncio.create_task(consume(timing_events.timing_endpoint(*LONG_SWEEP, request=page), old_outs))
        while not timing_runs.TIMING_RUNS.running():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)                     # the old sweep is inside its first point
        timing_events.stop_timing(page)
        stopped_at = time.perf_counter()
        new = asyncio.create_task(consume(timing_events.timing_endpoint(LECTURE, "16", ["naive"], request=page), new_outs))
        await asyncio.wait_for(asyncio.gather(old, new), timeout=60)
        return time.perf_counter() - stopped_at, old_outs, new_outs

    took, old_outs, new_outs = asyncio.run(main())
    assert took < 10, f"the old sweep ran {took:.1f} s past Stop"
    assert re.search(r"Stopped after \d of 6 lengths \(Stop was pressed\)", old_outs[-1][-1])   # and says so
    assert "Stopped" not in new_outs[-1][-1] and "T = 16" in new_outs[-1][-1]
    assert timing_runs.TIMING_RUNS.running() == 0


def test_a_cancelled_sweep_answers_at_once_and_the_next_waits_for_its_thread():
    """Cancelling the event (Stop's `cancels`, or a client cancelling its job) sets the run's flag and
    is answered at once (gradio_client's cancel gives up after 5 s); the worker thread finishes its
    timed block, and a sweep started meanwhile measures only after it stopped."""
    import asyncio
    import time

    from server import timing_events, timing_runs

    async def main():
        deadline = time.monotonic() + 120
        while (timing_runs.TIMING_RUNS.threads or timing_runs.TIMING_RUNS.unfinished) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)                    # an earlier test's sweep in this process stops first
        task = asyncio.create_task(consume(timing_events.timing_endpoint(LONG_SWEEP[0], "2048", ["naive"]), []))
        while not timing_runs.TIMING_RUNS.threads:         # inside its one long step (seconds)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        answered = time.perf_counter() - t0
        still_measuring = timing_runs.TIMING_RUNS.threads
        outs = []
        await asyncio.wait_for(consume(timing_events.timing_endpoint(LECTURE, "16", ["naive"]), outs), timeout=60)
        return answered, still_measuring, outs, timing_runs.TIMING_RUNS.running()

    answered, still_measuring, outs, running = asyncio.run(main())
    assert answered < 1.0 and still_measuring == 1        # answered while the old block still ran
    assert "T = 16" in outs[-1][-1] and running == 0


def cancel(job, tries: int = 6) -> None:
    """gradio_client's Job.cancel, tried again when its POST passes the client's 5 s read timeout (a loaded CI box):
    a cancel is idempotent, and what the tests check is what the server does once it is cancelled."""
    import httpx
    for attempt in range(tries):
        try:
            return job.cancel()
        except httpx.TimeoutException:
            if attempt == tries - 1:
                raise


def test_a_cancel_storm_runs_one_sweep_at_a_time(tmp_path):
    """Sixteen clients start a long sweep and cancel it at once: the server never runs two sweeps at
    the same time, and answers the next one."""
    import time
    log = tmp_path / "app.log"
    with running_app(log=log) as url:
        clients = [Client(url, verbose=False) for _ in range(4)]
        jobs = [c.submit(*LONG_SWEEP, api_name="/timing") for c in clients for _ in range(4)]
        for job in jobs:        # a cancel only reaches the server once the job is in its queue
            deadline = time.monotonic() + 30
            while job.status().code.name in ("STARTING", "JOINING_QUEUE") and time.monotonic() < deadline:
                time.sleep(0.02)
        start = time.monotonic()
        for job in jobs:
            cancel(job)
        time_fig, *_, note = clients[0].predict(LECTURE, "16", ["naive"], api_name="/timing")
        assert "Measured now on" in note and time.monotonic() - start < 30
    counts = [int(line.rsplit("; ", 1)[1].split()[0]) for line in log.read_text().splitlines()
              if "threads measuring" in line]
    assert counts and max(counts) == 1, counts


@pytest.mark.served_numbers
def test_every_view_runs_the_production_family(client):
    """The family control's endpoint moves the link to production; every view then answers on it."""
    query = client.predict(LECTURE + "&history_padding=1", "xrex", api_name="/family")
    assert "family=xrex" in query and "prefix" not in query          # what the family fixes stays implied
    _, _, _, kernel_text = client.predict(query, api_name="/mask")
    assert "| fa4 |" in kernel_text
    attn = client.predict(query + "&head=0", api_name="/attention")
    z = array(plot_data(attn[0])[0]["z"])
    assert z[0, 1:5].min() > 0                                      # the user token sees later history
    assert "recsys-bidirectional" in client.predict(query, api_name="/isolation")[2]
    inv = client.predict(query, api_name="/invariance")
    assert re.search(r"right-anchored: [^ ]+ \(within fp32 rounding: invariant\)", inv[1]), inv[1]
    assert "right-anchored positions" in inv[4]
    assert "serving-padding" in client.predict(query + "&bug=serving-padding", api_name="/variants")[4]
    assert client.predict(query, "grok", api_name="/family") == "preset=lecture&history_padding=1"   # preset weights back


def test_an_old_link_with_a_backend_opens_with_a_note(monkeypatch):
    """In-process page load of a link made before the backend control was removed."""
    from types import SimpleNamespace
    from server import links
    notes = []
    monkeypatch.setattr(links.gr, "Info", notes.append)
    req = SimpleNamespace(session_hash="old-link", query_params={"preset": "lecture", "backend": "flash_attn",
                                                                 "head": "1"})
    q, tab, _, marked = links.load_endpoint(req)     # (query, tab to open, the tabs' update, controls to mark)
    assert "head=1" in q and "backend" not in q and tab == "mask"
    assert len(notes) == 1 and "backend: ignored" in notes[0] and marked == {}
    assert links.load_endpoint(SimpleNamespace(session_hash="new", query_params={"head": "1"})) and len(notes) == 1


# --- admission: one visitor cannot fill the queue -------------------------------------------------

def test_the_queue_refuses_by_name_past_a_lanes_bounds_and_the_mask_keeps_answering(monkeypatch):
    """In-process server with the timing lane bounded at 2 waiting: a sweep runs, a second visitor's
    waits; that visitor's next one is refused (one per visitor); a third visitor's identical Run joins the
    waiting one (no place in the lane: server.timing_runs shares the measurement) and is answered with its
    points; a fourth's waits, a fifth's is refused (lane full) — each by name, at once — while /mask answers.
    Reads Gradio's queue for real: if its internals move, admission fails open and this test fails."""
    import time
    from dataclasses import replace

    import app
    from server import lanes, timing_runs
    from server import admission, visitors
    monkeypatch.setitem(admission.LANES, "timing", replace(admission.LANES["timing"], waiting=2))
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    # the long sweep holds the lane for the whole test: no turn ends it once others wait (explorer.limits)
    from explorer import limits
    monkeypatch.setitem(limits.SWEEP_TURN_S, "cpu", 3600.0)
    timing_runs.TIMING_RUNS.recent.clear()      # an earlier test's sweep of LECTURE would answer these at once
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        a, b, c, d, e = (Client(url, verbose=False, headers={"X-Forwarded-For": f"192.0.2.{i}"}) for i in range(5))
        running = a.submit(*LONG_SWEEP, api_name="/timing")
        deadline = time.monotonic() + 60
        while not timing_runs.TIMING_RUNS.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        queued = [b.submit(LECTURE, "16", ["naive"], api_name="/timing")]
        while lanes.lane_now(fake_request(demo), "timing")[0] == [] and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(Exception, match=r"queue: got '1 of your timing sweeps waiting'; allowed: 1 per visitor"):
            b.predict(LECTURE, "24", ["naive"], api_name="/timing")
        assert not running.done()               # refused at once: not after waiting for the sweep ahead of it
        joined = c.submit(LECTURE + "&seed=2&head=0", "16", ["naive"], api_name="/timing")     # the same sweep
        while sum(map(len, lanes.lane_now(fake_request(demo), "watch"))) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(lanes.lane_now(fake_request(demo), "timing")[0]) == 1           # no place taken in the lane
        queued.append(d.submit(LECTURE, "24", ["naive"], api_name="/timing"))
        while len(lanes.lane_now(fake_request(demo), "timing")[0]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(Exception, match=r"queue: got '2 timing sweeps waiting'; allowed: 2 at once"):
            e.predict(LECTURE, "32", ["naive"], api_name="/timing")
        assert not running.done()
        assert "allowed pairs" in e.predict("preset=lecture", api_name="/mask")[1]
        cancel(running)
        first, *_, note = queued[0].result(timeout=120)                 # the admitted ones still run
        assert "T = 16" in note and "T = 24" in queued[1].result(timeout=120)[-1]
        shared, *_, shared_note = joined.result(timeout=120)
        assert "T = 16" in shared_note and "Measured now on" in shared_note
        assert plot_data(shared) == plot_data(first)                    # one measurement's points
    finally:
        for session in list(timing_runs.TIMING_RUNS.by_session):     # no sweep outlives its test
            timing_runs.TIMING_RUNS.cancel(session)
        demo.close()


def join(url: str, fn_index: int, data: list, session: str, address: str) -> tuple[int, str]:
    """POST /gradio_api/queue/join as any HTTP client can, from `address` (as the proxy forwards it)."""
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                       "trigger_id": None}).encode()
    req = urllib.request.Request(f"{url}gradio_api/queue/join", data=body, headers={
        "Content-Type": "application/json", "X-Forwarded-For": f"1.1.1.1, {address}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_queue_builds_no_analytics_summary_per_event(monkeypatch):
    """Gradio rebuilds a pandas summary of its last 10,000 events after each one (for a monitoring page
    this app does not open): the app's queue never does, and keeps few event records."""
    import app
    queue = app.build_app()._queue
    monkeypatch.setattr(queue, "_get_df", lambda records: pytest.fail("a pandas summary was built"))
    queue.events_recorded += 10_000
    queue.compute_analytics_summary([{"function": "mask", "status": "success", "process_time": 0.01}])
    assert queue.ANALYTICS_MAX_EVENTS <= app.QUEUE_MAX


def test_the_queue_wakes_the_event_loop_seldom_while_no_event_can_start(monkeypatch):
    """Gradio's queue reader looks for an event to start every 1 ms while none can (and its progress sender every
    10 ms), each wake-up taking the GIL from the threads drawing views: the app's queue, idle for 0.5 s, wakes
    the loop at most once per QUEUE_POLL_S and PROGRESS_POLL_S; and the queue's status goes out every
    QUEUE_STATUS_S, not to every waiting event at each start (Gradio's "auto")."""
    import asyncio
    import app
    from server import gradio_patches
    queue = app.build_app()._queue
    assert not queue.live_updates and queue.update_intervals == gradio_patches.QUEUE_STATUS_S
    queue.active_jobs = [None] * queue.max_thread_count
    real_sleep, naps = asyncio.sleep, []

    async def counted(seconds, *args, **kwargs):
        naps.append(seconds)
        return await real_sleep(seconds, *args, **kwargs)

    async def idle_for(seconds):
        monkeypatch.setattr(asyncio, "sleep", counted)
        tasks = [asyncio.ensure_future(queue.start_processing()), asyncio.ensure_future(queue.start_progress_updates())]
        await real_sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(idle_for(0.5))
    assert len(naps) <= 0.5 / gradio_patches.QUEUE_POLL_S + 0.5 / gradio_patches.PROGRESS_POLL_S + 4, len(naps)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the server's memory map in /proc")
def test_the_server_parses_http_in_c_and_runs_asyncios_own_event_loop(server):
    """requirements.txt installs httptools, and uvicorn (as Gradio launches it) uses it by itself (its gain was measured
    together with uvloop's: load-soak-ab-uvloop-2026-11-27.json). uvloop, which accepts one new
    connection per turn of the loop, is not loaded even where it is installed (load-soak-ab-loop-2026-11-28.json).
    If a Gradio release passes its own loop or parser to uvicorn, this fails."""
    from benchmarks.load_test import server_pid
    pid = server_pid(server)
    assert pid is not None
    with open(f"/proc/{pid}/maps") as f:
        loaded = f.read()
    assert "httptools" in loaded
    assert "uvloop" not in loaded, "the server runs uvloop's event loop"
    import asyncio
    import uvicorn
    from server import gradio_patches
    gradio_patches.asyncio_event_loop()         # (app.build_app's) what uvicorn makes where uvloop is installed too
    loop = uvicorn.Config(app=None).get_loop_factory()()
    try:
        assert type(loop).__module__.startswith("asyncio."), type(loop)
    finally:
        loop.close()


def test_an_events_cheap_components_are_processed_on_the_event_loop(monkeypatch):
    """Gradio hands each input's preprocessing and each output's postprocessing to a worker thread and back, one
    round trip each (issue 34's soak: a third fewer honest requests served with them). An /attention call hands
    over only its function: its query box in, its figures (their JSON written once) and text out run where Gradio
    asks. A figure whose JSON is still to write, a file, or any other function still goes to a thread."""
    import asyncio
    import types
    import app
    import gradio.blocks
    from gradio.state_holder import SessionState
    from explorer.figures import bar_figure
    demo = app.build_app()
    shim, handed = gradio.blocks.anyio, []

    async def to_thread(fn, *args, **kwargs):
        handed.append(getattr(fn, "__name__", fn))
        return fn(*args)
    monkeypatch.setattr(shim, "_anyio", types.SimpleNamespace(to_thread=types.SimpleNamespace(run_sync=to_thread)))
    fn = next(f for f in demo.fns.values() if f.api_name == "attention")
    out = asyncio.run(demo.process_api(fn, [LECTURE], state=SessionState(demo)))
    assert handed == ["attention_endpoint"]
    assert [type(o) for o in out["data"]] == [dict, dict, str] and json.loads(out["data"][0]["plot"])["data"]
    plot, figure = gr.Plot(), bar_figure(["a", "b"], [1.0, 2.0], title="bars", segments=["U", "H"])
    asyncio.run(shim.to_thread.run_sync(plot.postprocess, figure))
    asyncio.run(shim.to_thread.run_sync(gr.File().preprocess, None))
    asyncio.run(shim.to_thread.run_sync(sorted, [2, 1]))
    assert handed[1:] == ["postprocess", "preprocess", "sorted"]
    asyncio.run(shim.to_thread.run_sync(plot.postprocess, figure.freeze()))
    assert len(handed) == 4


def test_long_work_asks_gradio_whether_its_requester_still_waits():
    """budget.check_wanted reads the running event in Gradio's queue: nothing while its page waits; Abandoned once
    Gradio cleaned the session's events (what it does when the page's stream closes); nothing in a direct call
    or for an event Gradio no longer runs. Reads Gradio's queue for real: if its internals move, this fails."""
    import asyncio
    import types
    import app
    from gradio.context import LocalContext
    from explorer import budget
    queue = app.build_app()._queue
    event = types.SimpleNamespace(_id="event-1", session_hash="page-1", alive=True)
    queue.active_jobs = [None, [event], None]
    budget.check_wanted()                               # a direct call: no event
    token = LocalContext.event_id.set("event-1")
    try:
        budget.check_wanted()
        asyncio.run(queue.clean_events(session_hash="page-1"))
        with pytest.raises(budget.Abandoned):
            budget.check_wanted()
        LocalContext.event_id.set("event-2")
        budget.check_wanted()
    finally:
        LocalContext.event_id.reset(token)


def test_skipped_outputs_are_answered_as_gradio_answers_them_without_building_a_component(monkeypatch):
    """A page redraw's skipped outputs (most of its 64) and its controls' marks (a message and classes each) are
    passed by (server.gradio_patches.skip_unchanged_outputs): the answer is the one Gradio's own postprocessing
    gives, output for output, for a mix of skips, marks, updates and values, one kept output, none kept; no
    component is built for a skip or a mark, nor any session config at all."""
    import asyncio
    import app
    import gradio as gr
    import gradio.blocks
    from gradio.state_holder import SessionState
    from explorer.controls import CONTROL_FIELDS
    from server.endpoints import CHANGE_OUTPUTS
    demo = app.build_app()
    fn = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "control_change_on_page")
    assert len(fn.outputs) == CHANGE_OUTPUTS
    n = len(fn.outputs)
    controls = range(2, 2 + len(CONTROL_FIELDS))
    marks = [gr.update(info="⚠ got -1", elem_classes=["invalid"]), gr.update(info=None, elem_classes=[]),
             gr.update(info="i", elem_classes="invalid"), gr.update(info="only info"), gr.update(elem_classes=[])]
    cases = [["preset=lecture", "a note"] + [gr.update(info="i", elem_classes=[]) for _ in controls]
             + [gr.skip()] * (n - 2 - len(CONTROL_FIELDS)),
             ["preset=lecture", "a note"] + [marks[i % len(marks)] for i in controls]
             + [gr.skip()] * (n - 2 - len(CONTROL_FIELDS)),
             [gr.skip()] + ["a note"] + [gr.skip()] * (n - 2),
             [gr.skip()] * n]
    gradio_own = lambda *a: gradio.blocks.Blocks.postprocess_data(demo, *a)   # noqa: E731
    for case in cases:
        ours = asyncio.run(demo.postprocess_data(fn, list(case), SessionState(demo)))
        theirs = asyncio.run(gradio_own(fn, [dict(p) if isinstance(p, dict) else p for p in case], SessionState(demo)))
        assert ours == theirs
    built, made = [], []
    monkeypatch.setattr(gradio.blocks.BlocksConfig, "config_for_block", lambda *a, **k: built.append(a) or {})
    for cls in {type(b) for b in fn.outputs}:       # a component built for an output
        init = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _init=init, **k: (made.append(type(self)), _init(self, *a, **k))[1])
    state = SessionState(demo)
    asyncio.run(demo.postprocess_data(fn, [gr.skip()] * n, state))
    asyncio.run(demo.postprocess_data(fn, cases[0], state))
    asyncio.run(demo.postprocess_data(fn, cases[1], state))
    assert built == [] and not any(state.config_values.values()) and made == []


def test_the_soak_client_speaks_the_pages_protocol(server):
    """benchmarks/load_test.py's plain-HTTP client (what the soak's visitors use): an answer reads as
    None, an event given fewer inputs than it has is completed with the page's own values (as
    gradio_client does), and a refusal comes back as the text that names its field."""
    from benchmarks.load_test import RawClient, _refusal, api_functions
    raw = RawClient(server, "10.9.0.1", api_functions(server))
    assert raw.call("mask", [LECTURE], "soakclient1") is None
    assert raw.call("timing", [LECTURE, "16", ["naive"]], "soakclient2") is None       # 3 of its 5 inputs
    refused = raw.call("mask", ["preset=lecture&num_history=-1"], "soakclient3")
    assert refused is not None and _refusal(refused) and "num_history" in refused, refused
    timed = raw.call("mask", [LECTURE], "soakclient4", timed=True)
    assert timed["error"] is None and all(timed[k] >= 0 for k in ("join_s", "wait_s", "run_s")), timed


def test_the_soak_clients_keep_their_connections_as_a_browser_does(server, monkeypatch):
    """An honest visitor of the soak reads each event stream to its end (Gradio's close_stream) and reuses one
    connection for its joins and streams, as a browser does; the attacker's client drops the connection once it
    has its answer, so each of its events is a new connection the server accepts."""
    import socket
    from benchmarks.load_test import RawClient, api_functions
    opened, connect = [], socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: opened.append(a[0]) or connect(*a, **k))
    fns = api_functions(server)
    for browser, address in ((True, "10.9.0.2"), (False, "10.9.0.3")):
        raw, before = RawClient(server, address, fns, browser=browser), len(opened)
        for n in range(3):
            assert raw.call("mask", [LECTURE], f"keepalive{browser:d}{n}") is None
        assert len(opened) - before == (1 if browser else 3), (browser, opened[before:])


def test_the_server_keeps_an_idle_connection_past_uvicorns_five_seconds(server):
    """A request sent on a kept-alive connection idle longer than uvicorn's default keep-alive (5 s, as Gradio
    starts it) is answered: the server is not the side that closes a connection its client (a browser, a proxy's
    pool) may be reusing at that moment, which the client sees as "disconnected without sending a response"."""
    import socket
    import uvicorn
    from server import gradio_patches
    idle_s = uvicorn.Config(app=None).timeout_keep_alive + 1.0
    assert idle_s < gradio_patches.KEEP_ALIVE_S
    host, port = server.split("//")[1].rstrip("/").split(":")

    def ask(conn) -> bytes:
        """GET /healthz on `conn` -> the answer's status line (its body read to its Content-Length)."""
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: explorer\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return b"closed without an answer"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        return head.split(b"\r\n", 1)[0]
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        assert ask(conn).startswith(b"HTTP/1.1 200")
        time.sleep(idle_s)
        assert ask(conn).startswith(b"HTTP/1.1 200"), f"a request {idle_s:.0f} s after the last answer"


def test_every_computing_endpoint_refuses_one_session_over_its_share_at_the_http_layer(monkeypatch):
    """One-input endpoints too (Gradio reads a 1-tuple of verdicts as a valid answer). With every view
    held running, one session joins each view endpoint 12 times: only its share is queued, the rest
    answered HTTP 422 naming the bound, and another address is still admitted."""
    import threading
    import time
    from dataclasses import replace

    import app
    from explorer import views
    from server import admission, lanes, visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = threading.Event()
    for view in views.drawn_views():            # every view's parts wait for the gate
        parts = tuple(replace(p, draw=lambda s, *a, **k: (gate.wait(60), ())[1]) for p in view.parts)
        monkeypatch.setitem(views.VIEWS, view.name, replace(view, parts=parts))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        fn_index = {d.api_name: i for i, d in enumerate(demo.fns.values())}
        for k, api in enumerate(VIEW_APIS):
            gate.clear()
            lane = admission.LANES["light" if api == "mask" else "forward"]
            attacker = f"198.51.100.{k}"
            answers = [join(url, fn_index[api], [LECTURE], f"attacker-{api}", attacker) for _ in range(12)]
            accepted = [a for a in answers if a[0] == 200]
            refused = [a for a in answers if a[0] == 422]
            assert len(accepted) == lane.per_visitor and len(refused) == 12 - lane.per_visitor, (api, answers)
            assert all("queue: got" in body and "per visitor" in body for _, body in refused), (api, refused)
            # fresh session hashes from the same address: only up to the address's share
            minted = [join(url, fn_index[api], [LECTURE], f"minted-{api}-{i}", attacker)[0] for i in range(12)]
            assert minted.count(200) == lane.per_address - lane.per_visitor, (api, minted)
            assert join(url, fn_index[api], [LECTURE], f"honest-{api}", f"203.0.113.{k}")[0] == 200, api
            gate.set()                                  # the admitted ones run; the lane drains
            deadline = time.monotonic() + 60
            while any(lanes.lane_now(fake_request(demo), lane.name)) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        gate.set()
        demo.close()


def test_no_event_function_has_its_annotations_compiled_at_each_call():
    """Gradio reads each event function's type hints at every call (to pass a gr.Request): none is left as a
    string for typing to compile again, and each reads as it did, the admission checks' gr.Request among them."""
    import typing

    import app
    from gradio.utils import get_type_hints
    before = {}
    with mock.patch("server.gradio_patches.resolve_annotations"):
        for fn in app.build_app().fns.values():
            for f in (fn.fn, fn.validator):
                if f is not None:
                    before.setdefault((fn.api_name, f is fn.validator), get_type_hints(f))
    demo = app.build_app()
    after, strings = {}, []
    for fn in demo.fns.values():
        for f in (fn.fn, fn.validator):
            if f is None:
                continue
            after.setdefault((fn.api_name, f is fn.validator), get_type_hints(f))
            target = getattr(f, "__func__", f)
            strings += [(fn.api_name, name) for name, hint in getattr(target, "__annotations__", {}).items()
                        if isinstance(hint, (str, typing.ForwardRef))]
    assert strings == [] and after == before
    assert all(hints.get("request") is gr.Request for (_, validator), hints in after.items() if validator)


def test_every_event_passes_admission_before_it_is_queued(monkeypatch):
    """Any event can be pushed by its index, also the page's own steps and the unload: every one carries a
    lane's admission check (a Stop only cancels), awaited on the event loop, none runs through /run/<name> past
    its lane, and one session pushing the committed timing curves (a queued page step that skipped admission
    before) 12 times while the first runs gets its share, the rest refused by name."""
    import inspect
    import threading

    import app
    from explorer import timing
    from server import admission, visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    demo = app.build_app()
    unchecked = [fn.api_name for fn in demo.fns.values()
                 if not fn.cancels and (fn.validator is None or fn.concurrency_id not in admission.LANES)]
    assert unchecked == [] and not demo.api_open
    threaded = [fn.api_name for fn in demo.fns.values()      # Gradio hands a plain function to a worker thread
                if fn.validator is not None and not inspect.iscoroutinefunction(fn.validator)]
    assert threaded == []
    gate = threading.Event()
    monkeypatch.setattr(timing, "timing_view", lambda *a, **k: gate.wait(60))
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        fn_index = {d.api_name: i for i, d in enumerate(demo.fns.values())}
        direct = urllib.request.Request(f"{url}gradio_api/run/attention", data=json.dumps({"data": [LECTURE]}).encode(),
                                        headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(direct, timeout=30)
        data = [LECTURE, "lecture", "float32", None]
        answers = [join(url, fn_index["timing_recorded"], data, "flood", "198.51.100.9") for _ in range(12)]
        lane = admission.LANES["control"]
        refused = [body for code, body in answers if code == 422]
        assert len(refused) == 12 - lane.per_visitor and all("queue: got" in b and "page steps" in b for b in refused)
        assert join(url, fn_index["timing_recorded"], data, "honest", "203.0.113.9")[0] == 200
    finally:
        gate.set()
        demo.close()


def fake_request(demo):
    from types import SimpleNamespace
    return SimpleNamespace(request=SimpleNamespace(app=SimpleNamespace(get_blocks=lambda: demo)))

# --- both families at every view, and production's weights through the upload ----------------------------

SMALL_XREX = ("preset=phoenix-2026-seqpack&emb_size=32&num_layers=2&key_size=8&num_q_heads=4&num_kv_heads=2&"
              "num_history=6&history_padding=2&num_candidates=4&candidate_padding=1")
FAMILY_QUERIES = {"grok": LECTURE + "&num_history=6&history_padding=2&num_candidates=4&candidate_padding=1",
                  "xrex": SMALL_XREX}


def own_probs(query: str, embeddings=None, ranker=None) -> np.ndarray:
    """Layer 0, head 0 attention weights of batch row 0 from the model's own recorded forward, in this process
    (the server builds the same seeded model): [T, T]. Another process, maybe on other CPU kernels and another
    thread count: the same real numbers, compared within layer0_bound."""
    from explorer import runs
    from explorer.query_string import parse_query
    out = runs.forward(parse_query(query))
    if ranker is not None:
        with torch.no_grad():
            return ranker(out.embeddings, out.valid, record=True).layers[0].probs[0, 0].numpy()
    return out.trunk.layers[0].probs[0, 0].numpy()


def layer0_bound(query: str) -> float:
    """Rounding bound of layer 0's attention weights: the embedding stage, the norm, the projections, RoPE,
    q.k and the softmax (depth 8), n the widest of these reductions."""
    from explorer.query_string import parse_query
    s = parse_query(query)
    return rounding_bound(torch.float32, max(s.emb_size, s.seq_len), depth=8)


def mask_answers(client, query, family, kind):
    fig, text, _, kernel_text = client.predict(query, api_name="/mask")
    z = array([t for t in plot_data(fig) if t["type"] == "heatmap"][0]["z"])
    assert bool(z[0, 2] > 0) == (family == "xrex")              # the user token sees later history: production
    assert f"| {kind} |" in text and "| fa4 |" in kernel_text


def attention_answers(client, query, family, kind):
    fig, _, _ = client.predict(query + "&head=0", api_name="/attention")
    assert relative_error(array(plot_data(fig)[0]["z"]), own_probs(query)) <= layer0_bound(query)


def anatomy_answers(client, query, family, kind):
    _, steps, _, text = client.predict(query + "&head=0&query=8", api_name="/anatomy")
    # the softmax step's bars: the last trace with values (the segment legend's entries hold none)
    weights = next(y for y in (array(t["y"]).astype(float) for t in reversed(plot_data(steps)))
                   if not np.isnan(y).all())
    assert relative_error(weights, own_probs(query)[8]) <= layer0_bound(query)
    assert "differ from the ones it used" in text
    assert ("× scale" in text) == (family == "xrex")


def isolation_answers(client, query, family, kind):
    _, _, text = client.predict(query, api_name="/isolation")
    assert f"**{kind}: isolated — largest change on any other candidate: residual stream 0, logits 0**" in text


def invariance_answers(client, query, family, kind):
    _, text, *_ = client.predict(query, api_name="/invariance")
    mode = "right-anchored" if family == "xrex" else "shared"
    assert re.search(rf"{mode}: [^ ]+ \(within fp32 rounding: invariant\)", text), text


def variants_answers(client, query, family, kind):
    from models.bugzoo import bug_names
    bug = bug_names(family)[0]
    *_, bug_text = client.predict(query + f"&bug={bug}", api_name="/variants")
    assert f"| **{bug}** |" in bug_text


def timing_answers(client, query, family, kind):
    *_, note = client.predict(query, "16, 32", ["naive", "structured"], api_name="/timing")
    assert f"mask '{kind}'" in note


def export_answers(client, query, family, kind):
    path = client.predict(query, "anatomy_steps", "png", api_name="/export_figure")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# what each tab of explorer.views.VIEWS answers for each family (a new view fails test_every_view_has_a_check)
ANSWERS = {"mask": mask_answers, "attention": attention_answers, "anatomy": anatomy_answers,
           "isolation": isolation_answers, "invariance": invariance_answers, "variants": variants_answers,
           "timing": timing_answers, "export": export_answers}


def test_every_view_has_a_check_for_both_families():
    assert list(ANSWERS) == list(VIEWS)


@pytest.mark.served_numbers
@pytest.mark.parametrize("family", ["grok", "xrex"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_every_view_answers_for_both_families(client, family, view):
    """At a small production preset (seqpack: primer_norm, soft_sign 80, no qk_norm) and at lecture,
    each view answers from its family's own model, not an error."""
    kind = "recsys-bidirectional" if family == "xrex" else "recsys"
    ANSWERS[view](client, FAMILY_QUERIES[family], family, kind)


@pytest.mark.served_numbers
def test_production_weights_upload_and_the_attention_view_is_their_forward(client, tmp_path):
    """A file saved from a random XrexRanker (production's stacked names) loads through the upload
    endpoint; the attention view's numbers are that ranker's own forward. A grok.py file is refused by
    name while the family is production's."""
    from explorer.query_string import parse_query
    from models.weights import save_weights
    from models.xrex import XrexRanker, init_xrex
    ranker = init_xrex(XrexRanker(parse_query(SMALL_XREX).xrex_config()), 42).eval()
    path = tmp_path / "xrex.safetensors"
    save_weights(ranker, path)
    q, msg = client.predict(SMALL_XREX, handle_file(str(path)), api_name="/upload_weights")
    assert "weights=upload%3A" in q and "Loaded" in msg
    fig, _, _ = client.predict(q + "&head=0", api_name="/attention")
    served = array(plot_data(fig)[0]["z"])
    assert relative_error(served, own_probs(SMALL_XREX, ranker=ranker)) <= layer0_bound(SMALL_XREX)
    grok_file, _ = make_weights(tmp_path)
    with pytest.raises(AppError, match=r"weights file: got 'w64.safetensors'; allowed: weights of the model family "
                                       r"chosen, production \(2026\): this file holds grok.py's per-layer names"):
        client.predict(q, handle_file(str(grok_file)), api_name="/upload_weights")
    again, _, _ = client.predict(q + "&head=0", api_name="/attention")      # the production upload still serves
    assert plot_data(again)[0]["z"] == plot_data(fig)[0]["z"]


def test_presets_and_the_family_control_agree_on_any_device():
    """In-process: every preset of both families is offered (the too-large ones say so in the list);
    a production preset brings its family; the family control answers on phoenix-prod too (it was
    refused on a CPU: 'emb_size: got 2560', before the model views were even asked for)."""
    from server import links
    from models.presets import PRESETS
    choices = dict((value, label) for label, value in links.preset_choices())
    assert set(choices) == set(PRESETS) and {"phoenix-2026", "phoenix-2026-nano", "phoenix-2026-seqpack"} <= set(choices)
    assert choices["phoenix-2026-nano"] == "phoenix-2026-nano"                       # runs on a CPU
    assert "mask view only" in choices["phoenix-2026"] and "mask view only" in choices["phoenix-2026-seqpack"]
    assert links.preset_endpoint("phoenix-2026-nano") == "preset=phoenix-2026-nano"
    assert links.preset_endpoint("lecture") == "preset=lecture"                  # a 2025 preset: grok.py's family
    assert links.family_endpoint("preset=phoenix-prod&head=1", "xrex") == "preset=phoenix-prod&family=xrex&head=1"
    back = links.family_endpoint("preset=phoenix-2026&head=1", "grok")
    assert back.startswith("preset=phoenix-prod&num_user=2") and "family" not in back


# --- memory a request leaves behind, the front door, plain words for API clients --------------------

@pytest.fixture(scope="module")
def front_door_server():
    """app.py's server in this process, launched as __main__ launches it (front door, session capacity),
    behind one trusted proxy, with a small raw-upload share."""
    import app
    from server import front_door, visitors
    mp = pytest.MonkeyPatch()
    mp.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    mp.setattr(front_door, "UPLOAD_ROUTE_SHARE", dict(max_bytes=3000, max_calls=5, window_s=3600.0))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                            **app.launch_options(demo))
    yield demo, url
    demo.close()
    mp.undo()


HEAVY_MASK = "preset=lecture&num_history=1535&num_candidates=512&zoom=candidates"


def test_no_session_keeps_a_copy_of_its_outputs(front_door_server):
    """No output is kept in session state (a heavy /mask is 17 MB, and a client can mint a session per
    call), and the number of sessions kept is bounded."""
    from server import memory
    demo, url = front_door_server
    for i in range(3):
        Client(url, verbose=False, headers={"X-Forwarded-For": f"192.0.2.{i}"}).predict(HEAVY_MASK, api_name="/mask")
    assert demo.state_session_capacity == memory.SESSION_CAPACITY <= 5000
    kept = {sid: len(json.dumps(state.config_values, default=str)) for sid, state in demo.state_holder.session_data.items()}
    assert kept and max(kept.values()) < memory.SESSION_STATE_BYTES, kept


def test_a_new_session_builds_no_copy_of_the_page_config(front_door_server, monkeypatch):
    """A client mints a session hash per call: Gradio built a deep-link copy of all 150 components'
    configs for each (~11 ms on the event loop, ~230 KB); a new session now builds none and still
    serves its events."""
    from gradio.blocks import BlocksConfig
    from gradio.state_holder import SessionState
    demo, url = front_door_server
    built = []
    real = BlocksConfig.config_for_block
    monkeypatch.setattr(BlocksConfig, "config_for_block",
                        staticmethod(lambda *a, **k: built.append(a[0]) or real(*a, **k)))
    state = SessionState(demo)
    assert built == [] and not any(state.config_values.values())
    assert state.blocks_config.blocks.keys() == demo.default_config.blocks.keys()
    code, _ = join(url, next(d["id"] for d in demo.config["dependencies"] if d.get("api_name") == "mask"),
                   ["preset=lecture"], "fresh-session", "198.51.100.40")
    assert code == 200 and built == []
    assert demo.state_holder["fresh-session"].config_values == {}


def upload(url: str, payload: bytes, address: str) -> tuple[int, str]:
    boundary = "x7a1b2"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"w.npz\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + payload + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"{url}gradio_api/upload", data=body, headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}", "X-Forwarded-For": address})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_raw_upload_route_is_bounded_per_visitor_whatever_its_session(front_door_server):
    """/gradio_api/upload: each visitor (address) has a share of bytes and calls per hour, refused by
    name past it; another address still uploads."""
    _, url = front_door_server
    answers = [upload(url, b"\0" * 800, "198.51.100.20") for _ in range(4)]
    assert [code for code, _ in answers] == [200, 200, 200, 413], answers
    assert "upload: got '" in answers[-1][1] and "bytes per visitor per 60 minutes" in answers[-1][1]
    assert upload(url, b"\0" * 900, "198.51.100.21")[0] == 200


def test_a_huge_json_body_is_refused_before_it_is_read(front_door_server):
    _, url = front_door_server
    code, body = join(url, 0, ["x" * (2 * 2**20)], "big", "198.51.100.30")
    assert code == 413 and "request body: got '2,097," in body


def test_a_malformed_call_is_not_echoed_back_in_full(front_door_server):
    """Too few inputs to an event with an admission check: Gradio's 400 echoed every input (10 MB)."""
    demo, url = front_door_server
    fn_index = {d.api_name: i for i, d in enumerate(demo.fns.values())}
    code, body = join(url, fn_index["timing"], ["y" * 300_000, "16", ["naive"]], "short", "198.51.100.31")
    assert code == 400 and len(body) < 5000 and "needed: 5, got: 3" in body


def test_api_clients_read_messages_as_plain_text(front_door_server):
    """< and > are escaped only where the message is rendered as HTML (the page), not for API clients."""
    _, url = front_door_server
    with pytest.raises(AppError, match=r"seed: got '<b>'"):
        Client(url, verbose=False).predict("preset=lecture&seed=<b>", api_name="/mask")


def test_a_terminated_server_removes_its_export_folders():
    """SIGTERM (a Space restarting) skipped atexit: export folders stayed in the system temp dir."""
    import os
    import tempfile
    import time
    from pathlib import Path
    with running_app() as url:
        port = url.rstrip("/").rsplit(":", 1)[-1].encode()
        pid = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _serves(p, port))
        root = Path(tempfile.gettempdir()) / f"explorer-exports-{pid}"
        Client(url, verbose=False).predict(LECTURE, "mask", "svg", api_name="/export_figure")
        assert root.is_dir()
    deadline = time.monotonic() + 15
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not root.exists() and not os.path.exists(f"/proc/{pid}")


def _serves(proc, port: bytes) -> bool:
    try:
        return b"app.py" in (proc / "cmdline").read_bytes() and \
            b"GRADIO_SERVER_PORT=" + port in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def test_the_started_server_leaves_the_page_and_imports_out_of_every_collection():
    """A full gc.collect holds the GIL throughout (the idle trim runs one; 220 ms on a quiet machine,
    about a second under load, every request stalled): what app.py builds before it serves is frozen
    out of the collector's reach, so a collection scans only what requests made since."""
    import subprocess
    import sys
    code = ("import gc, app\n"
            "from server import memory\n"
            "app.build_app()\n"
            "before = len(gc.get_objects())\n"
            "memory.freeze_startup_objects()\n"
            "print(before, gc.get_freeze_count(), len(gc.get_objects()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    before, frozen, left = map(int, out.stdout.split()[-3:])
    assert frozen >= 0.9 * before and left < 0.01 * before, (before, frozen, left)
    main = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.py")).read()
    assert main.index("memory.freeze_startup_objects()") < main.index("demo.launch(")


# --- round four: admission judges what is drawn, one charge per event, the queue never stops for good ------------

HEAVY_CONTROLS = "preset=phoenix-nano&emb_size=1024&num_history=1500&weights=random"


def page_change_data(query: str, tab: str, last_query: str, **raw) -> list:
    """The inputs of the page's control change (render_on_change; render_after_pick takes the pick first):
    every control set from `query` (raw values overriding: an invalid one), the tab, the last link."""
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import control_value
    s = parse_query(query, need_model=False)
    values = [raw.get(f, control_value(s, f)) for f in CONTROL_FIELDS]
    return values + [tab, last_query]


def test_an_invalid_control_cannot_smuggle_heavy_work_past_admission(monkeypatch):
    """The controls of a ~550 GFLOP view with one invalid value (seed -1) and a lecture last link: the page's
    handler draws the valid controls (the seed from the last link), so admission estimates exactly that —
    the heavy lane and the visitor's work share — through render_on_change and render_after_pick alike; the
    estimate was 0.01 GFLOP from the last link, and 16 such draws ran in 2 minutes."""
    import threading

    import app
    from explorer import views
    from server import admission, lanes, visitors
    from dataclasses import replace
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = threading.Event()
    view = views.VIEWS["invariance"]
    parts = tuple(replace(p, draw=lambda s, *a, n=len(p.outputs), **k: (gate.wait(60), (None,) * n)[1])
                  for p in view.parts)                  # drawn as nothing: 550 GFLOP would take minutes here
    monkeypatch.setitem(views.VIEWS, "invariance", replace(view, parts=parts))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        fn_index = {d.api_name: i for i, d in enumerate(demo.fns.values())}
        data = page_change_data(HEAVY_CONTROLS, "invariance", "preset=lecture", seed=-1)
        key = "addr:198.51.100.70"
        assert join(url, fn_index["render_on_change"], data, "smuggler1", "198.51.100.70")[0] == 200
        deadline = time.monotonic() + 30
        while not lanes.lane_now(fake_request(demo), "heavy")[1] and time.monotonic() < deadline:
            time.sleep(0.05)                    # it runs in the heavy lane, not the model views'
        assert lanes.lane_now(fake_request(demo), "heavy")[1] and not lanes.lane_now(fake_request(demo), "forward")[1]
        taken = sum(n for _, n in admission.ADMISSION.rates["work"].log[key])
        assert taken > 400, taken               # GFLOP of the visitor's work share
        code, body = join(url, fn_index["render_after_pick"], ["head=1"] + data, "smuggler2", "198.51.100.70")
        assert code == 200 and sum(n for _, n in admission.ADMISSION.rates["work"].log[key]) > 2 * taken - 1
        for i in range(3, 40):                                  # the share (or the heavy lane) ends it, by name
            code, body = join(url, fn_index["render_on_change"], data, f"smuggler{i}", "198.51.100.70")
            if code != 200:
                break
        assert code == 422 and ("work: got" in body or "queue: got" in body), body
    finally:
        gate.set()
        demo.close()


def test_a_superseded_redraw_is_answered_at_once_not_when_its_turn_comes(monkeypatch):
    """A lecturer switches to a heavy preset and back within a second: the first redraw waits in the heavy lane
    behind another visitor's running work. The page's newer redraw answers it at once, every output left as
    it is (gr.skip), instead of when its turn comes (its figures showed progress all that while: 60 s in the
    soak); the newer one is drawn."""
    import threading

    import app
    from explorer import views
    from server import lanes, visitors
    from dataclasses import replace
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = threading.Event()
    view = views.VIEWS["invariance"]
    parts = tuple(replace(p, draw=lambda s, *a, n=len(p.outputs), **k: (gate.wait(60), (None,) * n)[1])
                  for p in view.parts)
    monkeypatch.setitem(views.VIEWS, "invariance", replace(view, parts=parts))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        from benchmarks.load_test import RawClient, api_functions
        fns = api_functions(url)
        heavy = page_change_data(HEAVY_CONTROLS, "invariance", "preset=lecture")
        other = RawClient(url, "198.51.100.80", fns)
        threading.Thread(target=lambda: other.call("render_on_change", heavy, "otherpage"), daemon=True).start()
        deadline = time.monotonic() + 30
        while not lanes.lane_now(fake_request(demo), "heavy")[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lanes.lane_now(fake_request(demo), "heavy")[1]           # the other visitor's heavy work runs
        lecturer, answers = RawClient(url, "198.51.100.81", fns), []
        both = threading.Thread(target=lambda: answers.append(lecturer.call_many(
            [("render_on_change", heavy), ("render_on_change", page_change_data(LECTURE + "&seed=3", "attention",
                                                                                LECTURE))], "lecturerpage", 0.5)),
            daemon=True)
        both.start()
        both.join(30)
        assert answers == [[None, None]] and not gate.is_set()
        assert not lanes.lane_now(fake_request(demo), "heavy")[0]        # nothing of the lecturer's waits
    finally:
        gate.set()
        demo.close()


def test_a_page_redraw_is_charged_once_however_many_guards_it_passes(monkeypatch):
    """control_change_on_page -> render_tab -> the view endpoint: each guarded, each charged ADMISSION.served
    (three charges per page redraw, one per API call: the fair queue favoured API clients about 3x). Now
    every queued event is charged once, its whole running time."""
    import app
    from server import admission, visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    demo = app.build_app()
    charges = []
    served = admission.ADMISSION.served
    monkeypatch.setattr(admission.ADMISSION, "served", lambda key, s: (charges.append((key, s)), served(key, s))[1])
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        from benchmarks.load_test import RawClient, api_functions
        raw = RawClient(url, "198.51.100.71", api_functions(url))
        data = page_change_data(LECTURE + "&seed=3", "attention", LECTURE)
        assert raw.call("render_on_change", data, "billedonce") is None
        deadline = time.monotonic() + 10
        while not charges and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert [key for key, _ in charges] == ["addr:198.51.100.71"], charges
        assert raw.call("attention", [LECTURE + "&seed=4"], "apionce") is None
        time.sleep(0.2)
        assert len(charges) == 2
    finally:
        demo.close()


def test_the_event_log_says_where_each_queued_events_time_went_and_the_soak_reads_it(monkeypatch, tmp_path):
    """With server.gradio_patches.EVENT_LOG_ENV set, every queued event is written as it ends: its visitor,
    endpoint, lane and when it was queued, started and ended (queued <= started <= ended); the soak's
    server_side groups them by the soak's visitor sides and lanes. Unset, nothing is written."""
    import json

    import app
    from benchmarks.load_test import CLASSROOM_ADDRESS, RawClient, api_functions, server_side
    from server import gradio_patches, visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv(gradio_patches.EVENT_LOG_ENV, str(log))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        raw = RawClient(url, CLASSROOM_ADDRESS, api_functions(url))
        start = time.monotonic()
        assert raw.call("mask", [LECTURE + "&seed=5"], "logged") is None
        assert raw.call("attention", [LECTURE + "&seed=5"], "logged") is None
        deadline = time.monotonic() + 10
        while len(log.read_text().splitlines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        events = [json.loads(line) for line in log.read_text().splitlines()]
        ours = [e for e in events if e.get("key") == f"addr:{CLASSROOM_ADDRESS}"]   # the loop's windows: no key
        assert [(e["api"], e["lane"]) for e in ours] == [("mask", "light"), ("attention", "forward")], events
        assert all(start <= e["queued"] <= e["started"] <= e["ended"] <= time.monotonic() for e in ours)
        summary = server_side(log, start, time.monotonic())["classroom"]
        assert set(summary) == {"light", "forward"} and all(r["events"] == 1 for r in summary.values())
    finally:
        demo.close()
    monkeypatch.delenv(gradio_patches.EVENT_LOG_ENV)
    quiet = app.build_app()
    log.unlink()
    _, url, _ = quiet.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        assert RawClient(url, CLASSROOM_ADDRESS, api_functions(url)).call("mask", [LECTURE], "quiet") is None
        assert not log.exists()
    finally:
        quiet.close()


def test_a_head_change_through_the_queue_reads_its_settings_once_and_estimates_its_view_once(monkeypatch):
    """Issue 36, item 1, through Gradio's queue: the page's control change (render_on_change) changing the head
    on the Attention tab is read once, by its admission (the last link and the controls: two parse_settings,
    one endpoints.page_change), and its view estimated once; the handler draws from what admission kept on
    the request (server.guard.Read). It read the settings 5 times and estimated the view 3 times."""
    import app
    from counting import count_reads
    from server import visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        from benchmarks.load_test import RawClient, api_functions
        raw = RawClient(url, "198.51.100.72", api_functions(url))
        data = page_change_data(LECTURE + "&head=1", "attention", LECTURE)
        counts = count_reads(monkeypatch)
        assert raw.call("render_on_change", data, "headonce") is None
        assert counts == {"parse_settings": 2, "parse_query": 1, "page_change": 1, "estimate": 1}, counts
    finally:
        demo.close()


def test_sessions_minted_past_gradios_table_never_stop_the_queue(monkeypatch):
    """Stop events (they cancel, and pass no lane) joined with a fresh session hash each, past the table of
    per-session messages: an honest event in flight keeps its session and gets its answer, a session hash no
    client makes is refused by name, the minting address is held to its rate of new sessions, and the queue
    and its health answer stay up. Gradio's table dropped the oldest session whatever it held, its reader
    raised KeyError, and the queue stopped for every visitor."""
    import threading

    import app
    from explorer import views
    from server import admission, backoff, gradio_patches, memory, visitors
    from dataclasses import replace
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    monkeypatch.setattr(memory, "SESSION_CAPACITY", 40)
    # no refill while the 120 joins are sent (at 1 a second, joins that take over a second let a 101st in)
    monkeypatch.setattr(gradio_patches, "NEW_SESSION_RATE", dict(what="new sessions", burst=100, per_s=1e-3))
    # refused at once, so the bucket's count is exact (backoff's waits: tests/test_server_front_door.py)
    monkeypatch.setattr(backoff, "STEP_S", 0.0)
    gate = threading.Event()
    view = views.VIEWS["attention"]
    parts = tuple(replace(p, draw=lambda s, *a, **k: (gate.wait(60), p.draw(s, *a, **k))[1]) for p in view.parts)
    monkeypatch.setitem(views.VIEWS, "attention", replace(view, parts=parts))
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                            **app.launch_options(demo))
    try:
        from benchmarks.load_test import RawClient, api_functions
        fns = api_functions(url)
        honest = RawClient(url, "203.0.113.72", fns)
        answer = []
        waiting = threading.Thread(target=lambda: answer.append(honest.call("attention", [LECTURE], "honestinflight")),
                                   daemon=True)
        waiting.start()
        deadline = time.monotonic() + 30
        while "honestinflight" not in demo._queue.pending_messages_per_session and time.monotonic() < deadline:
            time.sleep(0.02)
        stop = next(i for i, f in demo.fns.items() if f.cancels)     # the Stop's cancel: it passes no lane
        # an address no other test uses: the visitor tables (server.browsers, server.backoff) are the process's
        answers = [join(url, stop, [], f"minted{i:05d}", "198.51.100.172") for i in range(120)]
        codes = [code for code, _ in answers]
        assert codes.count(200) == 100 and set(codes) == {200, 400}, [(c, b[:200]) for c, b in answers if c != 200]
        code, body = join(url, stop, [], "z" * 5000, "198.51.100.73")
        assert code == 400 and "session_hash: got" in body
        assert len(demo._queue.pending_messages_per_session) <= 40
        assert len(demo._queue.pending_event_ids_session) <= 40 + admission.QUEUE_MAX
        gate.set()
        waiting.join(60)
        assert answer == [None] and not demo._queue.stopped
        assert json.loads(urllib.request.urlopen(f"{url}healthz", timeout=10).read())["queue"] == "running"
        assert honest.call("mask", [LECTURE], "afterwards") is None
    finally:
        gate.set()
        demo.close()


def test_a_queue_whose_loop_failed_is_restarted_and_its_health_says_so(monkeypatch):
    """Anything raising in Gradio's queue loop set `stopped`, and every later event of every visitor was
    refused (503 Queue is stopped) while the page still loaded. The loop is restarted, the restart counted
    in /healthz, and the next visitor is served; a queue that stays stopped answers 503 there."""
    import app
    from server import gradio_patches, visitors
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                            **app.launch_options(demo))
    try:
        from benchmarks.load_test import RawClient, api_functions
        raw = RawClient(url, "203.0.113.74", api_functions(url))
        queue = demo._queue
        real, failed = queue.get_events, []

        def failing():
            if not failed:
                failed.append(1)
                raise KeyError("a session Gradio no longer holds")
            return real()
        monkeypatch.setattr(queue, "get_events", failing)
        raw.call("mask", [LECTURE], "firstafterfail")          # may be lost with the failed loop
        deadline = time.monotonic() + 10
        while queue.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert failed and queue.restarts == 1
        assert raw.call("mask", [LECTURE], "served") is None
        health = json.loads(urllib.request.urlopen(f"{url}healthz", timeout=10).read())
        assert health["queue"] == "running" and health["restarts"] == 1
        stuck = type("Demo", (), {"_queue": type("Queue", (), {"stopped": True, "loop_alive": True, "restarts": 3,
                                                               "pending_messages_per_session": {}})()})()
        assert gradio_patches.queue_health(stuck)()[0] is False
    finally:
        demo.close()


def test_a_full_lane_refuses_the_heaviest_networks_request_not_the_honest_newcomers(monkeypatch):
    """Through Gradio's queue: the timing lane (2 waiting here) held by addresses of one /24, an honest
    sweep from another network arrives — it is admitted, and the botnet's latest waiting sweep is answered
    by name and taken out of the queue; another address of the botnet is refused. The full lane refused the
    honest newcomer before."""
    import threading

    import app
    from server import admission, lanes, timing_runs, visitors
    from dataclasses import replace
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    monkeypatch.setitem(admission.LANES, "timing", replace(admission.LANES["timing"], waiting=2))
    # the long sweep holds the lane for the whole test: no turn ends it once others wait (explorer.limits)
    from explorer import limits
    monkeypatch.setitem(limits.SWEEP_TURN_S, "cpu", 3600.0)
    timing_runs.TIMING_RUNS.recent.clear()      # an earlier test's sweep of LECTURE would answer these at once
    demo = app.build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        from benchmarks.load_test import RawClient, api_functions
        fns = api_functions(url)
        answers = {}

        def sweep(address, session, args):
            thread = threading.Thread(target=lambda: answers.__setitem__(
                session, RawClient(url, address, fns).call("timing", list(args), session)), daemon=True)
            thread.start()
            return thread

        def waiting():
            return sorted(h.session for h in lanes.lane_now(fake_request(demo), "timing")[0])

        def until(condition):
            deadline = time.monotonic() + 60
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.05)
            return condition()
        sweep("198.18.17.1", "botrun", LONG_SWEEP)
        assert until(lambda: timing_runs.TIMING_RUNS.running())
        for i in (2, 3):                # sweeps of their own (an identical one would join, taking no place)
            sweep(f"198.18.17.{i}", f"botwait{i}", (LECTURE, str(8 * i), ["naive"]))
            assert until(lambda: f"botwait{i}" in waiting())
        honest = sweep("203.0.113.9", "honest", (LECTURE, "32", ["naive"]))
        assert until(lambda: waiting() == ["botwait2", "honest"]), waiting()
        assert until(lambda: "botwait3" in answers)
        assert "queue: got 'your place in a full lane'; allowed: room first for a visitor whose network" \
            in answers["botwait3"]
        fn, defaults = fns["timing"]
        code, body = join(url, fn, [LECTURE, "40", ["naive"], *defaults[3:]], "botwait4", "198.18.17.4")
        assert code == 422 and "2 timing sweeps waiting" in body
        timing_runs.TIMING_RUNS.cancel("botrun")
        honest.join(120)
        assert answers["honest"] is None
    finally:
        timing_runs.TIMING_RUNS.cancel("botrun")
        demo.close()


def test_a_gpu_server_builds_the_production_presets_at_start_up(monkeypatch):
    """app.warm_up runs each of explorer.runs.warm_up_queries through runs.forward in the background after start-up:
    on a CPU the default view's model and phoenix-nano's, as before; on a GPU the production presets' too, so that
    no visitor's first call there pays their seeded init (~12 s of CPU at phoenix-prod); on ZeroGPU, where a GPU
    exists only inside a GPU call, not those."""
    import app
    ran = []
    monkeypatch.setattr(app.runs, "forward", lambda s: ran.append(s.preset))
    monkeypatch.setenv("EXPLORER_PREWARM_FLEX", "0")
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    app.warm_up()
    assert ran == ["lecture", "phoenix-nano"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)      # a GPU's limits admit the production presets
    ran.clear()
    app.warm_up()
    assert ran == ["lecture", "phoenix-nano", "phoenix-prod", "phoenix-2026", "phoenix-2026-seqpack"]
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    ran.clear()
    app.warm_up()
    assert ran == ["lecture", "phoenix-nano"]


def test_the_loop_watcher_sees_the_loop_held_and_the_soak_reads_its_share(tmp_path):
    """server.gradio_patches.watch_the_loop: a step that holds the loop 0.25 s shows as a tick that late, the
    windows cover the time watched, and on Linux the loop thread's time on a CPU is what it spent spinning; the
    soak's event_loop reads the windows inside its span only, and every share from them."""
    import asyncio
    import json

    from benchmarks.load_test import event_loop
    from server import gradio_patches
    log = tmp_path / "events.jsonl"

    async def watched():
        with open(log, "a", buffering=1) as f:
            task = asyncio.get_running_loop().create_task(gradio_patches.watch_the_loop(f))
            await asyncio.sleep(1.1)
            spin = time.perf_counter()
            while time.perf_counter() - spin < 0.25:        # the loop held, as a slow step holds it
                pass
            await asyncio.sleep(1.2)
            task.cancel()
    start = time.monotonic()
    asyncio.run(watched())
    windows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(windows) >= 2 and all(0.99 <= w["window_s"] < 2.0 for w in windows)    # 3 where a sleep ran late
    lags = [x for w in windows for x in w["lags_s"]]
    assert 0.24 <= max(lags) < 0.5 and sorted(lags)[len(lags) // 2] < 0.01
    summary = event_loop(log, start, time.monotonic())
    assert summary["ticks"] == len(lags) and summary["lag_max_s"] == round(max(lags), 3)
    assert summary["lag_p50_s"] < 0.01 and summary["lag_p95_s"] >= 0.24     # a tenth of the time was that one tick
    if windows[0]["on_cpu_s"] is not None:
        assert summary["on_cpu_share"] >= 0.25 / summary["watched_s"] * 0.9
        assert abs(summary["on_cpu_share"] + summary["waiting_for_cpu_share"] + summary["asleep_share"] - 1) < 2e-3
    assert event_loop(log, windows[0]["loop"], time.monotonic())["ticks"] == sum(len(w["lags_s"]) for w in windows[1:])
    assert event_loop(log, start, windows[0]["loop"] - 0.001)["ticks"] == 0         # a window half inside: not read


def test_the_login_check_of_a_join_and_its_stream_runs_on_the_loop_and_still_refuses(monkeypatch):
    """server.gradio_patches.check_logins_on_the_loop: Gradio's login check (a plain function FastAPI hands to a
    worker thread, one more turn of the event loop per request) is called on the loop for a join and its stream,
    and behind a login it still refuses a visitor who has none (401)."""
    from fastapi.dependencies import utils as dependency_utils

    from server import gradio_patches
    gradio_patches.check_logins_on_the_loop()
    handed = []
    to_thread = dependency_utils.run_in_threadpool

    async def counted(fn, *args, **kwargs):
        handed.append(getattr(fn, "__name__", repr(fn)))
        return await to_thread(fn, *args, **kwargs)
    monkeypatch.setattr(dependency_utils, "run_in_threadpool", counted)
    with gr.Blocks() as demo:
        box = gr.Textbox()
        box.submit(lambda s: s.upper(), box, box, api_name="shout")
    demo.queue()
    answered = []
    for auth in (None, ("student", "secret")):
        _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                                auth=auth)
        try:
            code, body = join(url, 0, ["hi"], "login0001", "203.0.113.7")
            if auth is not None:
                assert code == 401 and "Not authenticated" in body
                continue
            assert code == 200, body
            with urllib.request.urlopen(f"{url}gradio_api/queue/data?session_hash=login0001", timeout=30) as r:
                stream = r.read().decode()
            assert '"msg":"process_completed"' in stream and "HI" in stream
            answered.append(url)
        finally:
            demo.close()
    assert answered and "login_check" not in handed


def test_the_root_url_is_gradios_for_every_request_and_worked_out_once_per_spelling(monkeypatch):
    """server.gradio_patches.remember_root_urls: for requests that differ in any part Gradio builds its root URL
    from (host, forwarding headers, scheme, path, root path, arguments) the answer is Gradio's own; asked again for
    the same parts it is not worked out again; and made-up hosts keep at most ROOT_URLS answers."""
    from gradio import route_utils
    from starlette.requests import Request

    from server import gradio_patches
    original = route_utils.get_root_url
    if getattr(original, "remembered", False):                  # app.build_app ran in this process
        monkeypatch.setattr(route_utils, "get_root_url", original.__wrapped_compute__)
        original = original.__wrapped_compute__
    computed = []

    def counted(request, route_path, root_path):
        computed.append(route_path)
        return original(request=request, route_path=route_path, root_path=root_path)
    monkeypatch.setattr(route_utils, "get_root_url", counted)
    gradio_patches.remember_root_urls()
    remembered = route_utils.get_root_url
    assert remembered is not counted

    def request(path="/gradio_api/queue/join", scheme="http", root_path="", **headers):
        return Request({"type": "http", "scheme": scheme, "server": ("127.0.0.1", 7860), "path": path,
                        "root_path": root_path, "query_string": b"", "method": "POST",
                        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]})
    cases = [(request(host="127.0.0.1:7860"), "/gradio_api/queue/join", None),
             (request(host="example.org"), "/gradio_api/queue/join", None),
             (request(host="example.org", x_forwarded_proto="https"), "/gradio_api/queue/join", None),
             (request(host="example.org", x_forwarded_host="space.hf.space, other"), "/gradio_api/queue/join", None),
             (request(host="example.org", x_gradio_server="http://10.0.0.2:7860"), "/gradio_api/queue/join", None),
             (request(path="/app/gradio_api/queue/join", root_path="/app", host="example.org"),
              "/gradio_api/queue/join", "/app"),
             (request(host="example.org"), "/gradio_api/queue/join", "https://mirror.example.org/x/")]
    answers = [remembered(r, p, root) for r, p, root in cases]
    assert answers == [original(request=r, route_path=p, root_path=root) for r, p, root in cases]
    assert len(set(answers)) == len(answers) and len(computed) == len(cases)
    assert [remembered(r, p, root) for r, p, root in cases] == answers and len(computed) == len(cases)
    for i in range(gradio_patches.ROOT_URLS + 50):
        remembered(request(host=f"made-up-{i}.example"), "/gradio_api/queue/join", None)
    computed.clear()
    remembered(*cases[0])
    assert computed == ["/gradio_api/queue/join"]             # pushed out by the made-up hosts: worked out again
    assert remembered.kept_size() <= gradio_patches.ROOT_URLS
