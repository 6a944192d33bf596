"""API fuzz: every named endpoint of app.py, called through gradio_client with wrong types, NaN,
inf, huge and negative values and very long strings, answers with a clear message — "field: got
value; allowed: ..." with no traceback — and the server keeps answering valid requests afterwards.

The app runs in a subprocess on a free localhost port (traffic only to 127.0.0.1). Its number boxes,
dropdowns, radios and checkbox groups pass values through untouched (no rounding, no choice check),
so even text in an integer box or a choice outside a dropdown reaches the validation layer.
"""
import re

import pytest

pytestmark = pytest.mark.slow

gradio_client = pytest.importorskip("gradio_client")
from explorer.controls import CONTROL_FIELDS, NUMBER_FIELDS  # noqa: E402  (the app's own control order)
from explorer.schema import Settings  # noqa: E402
from explorer.settings import all_values  # noqa: E402
from explorer.views import drawn_views  # noqa: E402

VIEWS = tuple(f"/{v.name}" for v in drawn_views())
# endpoints fuzzed argument by argument below; the rest take a query string (+ the visible tab) or nothing
BY_ARGUMENT = ("/settings", "/control_change", "/render_on_change", "/timing", "/export_figure", "/lecture_pack",
               "/upload_weights", "/preset", "/family")
# "field: got value; allowed: what" — the validation layer's one message shape
CLEAR = re.compile(r"^(?P<field>[A-Za-z_][\w ]{0,40}): got .+; allowed: .+", re.S)
TRACEBACK = ("Traceback (most recent call last)", 'File "', ", line ")


@pytest.fixture(scope="module")
def endpoints(server):
    """Every named endpoint, also those the API page leaves out (the page's own steps)."""
    import json
    import urllib.request
    with urllib.request.urlopen(server + "gradio_api/info?all_endpoints=True") as r:
        return json.load(r)["named_endpoints"]


def parameter_names(endpoint) -> list:
    return [p["parameter_name"] for p in endpoint["parameters"]]


def query_endpoints(endpoints) -> dict:
    """api -> extra arguments after the query string: () or the visible tab."""
    shapes = {("query",): (), ("query", "tab"): ("attention",)}
    return {api: shapes[tuple(parameter_names(e))] for api, e in endpoints.items()
            if tuple(parameter_names(e)) in shapes}


def refused(client, api, *args) -> str:
    """The call must fail with a message; return it after checking it carries no traceback."""
    try:
        result = client.predict(*args, api_name=api)
    except Exception as e:                                  # noqa: BLE001 — AppError, or the client's own
        text = str(e)
    else:
        pytest.fail(f"{api}{args!r:.200} was accepted: {result!r:.200}")
    assert text and not any(t in text for t in TRACEBACK), f"{api}: traceback text in {text[:400]!r}"
    return text


def assert_names_field(text, field=None):
    m = CLEAR.match(text)
    assert m, f"no field named: {text[:300]!r}"
    if field is not None:
        assert m["field"] == field, f"expected {field!r} named: {text[:300]!r}"


# --- the configuration as a query string: every endpoint that takes one --------------------

BAD_QUERIES = [
    ("num_candidates=nan", "num_candidates"),
    ("num_history=inf", "num_history"),
    ("delta=-inf", "delta"),
    ("emb_size=1e30", "emb_size"),
    ("seed=99999999999999999999999999", "seed"),
    ("num_history=-5", "num_history"),
    ("num_candidates=0", "num_candidates"),
    ("key_size=3", "key_size"),
    ("num_q_heads=3&num_kv_heads=2", "num_q_heads"),
    ("num_history=2000&num_candidates=512", "num_history"),     # past the CPU layout cap (2048)
    ("preset=phoenix-prod", "emb_size"),                         # too many parameters for a CPU
    ("preset=phoenix-nano&num_layers=16&num_q_heads=64&num_kv_heads=64&emb_size=64&key_size=2",
     "num_layers"),                                              # ~9 GiB of recorded attention
    ("head=99", "head"),
    ("weights=upload:deadbeef", "weights"),
    ("preset=" + "x" * 3000, "preset"),
    ("x" * 100_000, "query string"),
    ("bogus_field=1", "settings"),
    (12345, None),                                               # wrong types
    (None, "query string"),
    (["preset=lecture"], None),
]


@pytest.mark.parametrize("query,field", BAD_QUERIES, ids=[f"{i}" for i in range(len(BAD_QUERIES))])
@pytest.mark.parametrize("api", VIEWS)
def test_views_refuse_bad_configurations_by_name(client, api, query, field):
    if api == "/mask" and field in ("emb_size", "num_layers") and "=1e30" not in query:
        # a model too large for the device: the mask view builds no model and draws the layout
        out = client.predict(query, api_name=api)
        assert "| recsys |" in out[1]
        return
    assert_names_field(refused(client, api, query), field)


def test_every_other_query_endpoint_refuses_by_name(client, endpoints):
    """sync_*/render_*/lecture_pack: the same validation, a few cases each."""
    others = {api: extra for api, extra in query_endpoints(endpoints).items() if api not in VIEWS}
    assert others, "no query endpoints found"
    for api, extra in others.items():
        for query, field in (("num_candidates=nan", "num_candidates"), ("emb_size=1e30", "emb_size"),
                             ("x" * 100_000, "query string")):
            assert_names_field(refused(client, api, query, *extra), field)


@pytest.mark.parametrize("tab", ["nope", 12345, "x" * 10_000, None])
def test_render_names_an_unknown_tab(client, tab):
    assert_names_field(refused(client, "/render_mask", "preset=lecture", tab), "tab")


@pytest.mark.parametrize("tab", ["timing", "export"])
def test_render_checks_the_query_on_tabs_drawn_on_demand(client, tab):
    assert_names_field(refused(client, "/render_mask", "num_candidates=nan", tab), "num_candidates")


# --- /settings: every control as its own argument -----------------------------------------------

def control_values(**changes) -> list:
    d = all_values(Settings(weights="random"))
    return [changes.get(f, d[f]) for f in CONTROL_FIELDS]


NUMERIC = [f for f in CONTROL_FIELDS if f in NUMBER_FIELDS]
INTEGER = {f for f, v in all_values(Settings()).items() if type(v) is int}
SETTINGS_CASES = (
    [(name, -1e7 if name == "delta" else -5) for name in NUMERIC if name not in ("head", "query")]
    + [(name, 10**30 if name in INTEGER else 1e308) for name in NUMERIC if name != "head"]
    + [("widening_factor", "inf"), ("logit_cap", "nan"), ("multiplier", "x" * 10_000), ("rope_base", [1.0]),
       ("key_size", 3), ("num_q_heads", 3)]
)


def with_tab(api) -> tuple:
    return ("mask",) if api == "/control_change" else ()


@pytest.mark.parametrize("name,value", SETTINGS_CASES, ids=[f"{n}={v!r:.12}" for n, v in SETTINGS_CASES])
@pytest.mark.parametrize("api", ["/settings", "/control_change"])
def test_every_control_is_refused_by_name(client, endpoints, api, name, value):
    assert len(endpoints[api]["parameters"]) == len(CONTROL_FIELDS) + len(with_tab(api))
    assert_names_field(refused(client, api, *control_values(**{name: value}), *with_tab(api)), name)


@pytest.mark.parametrize("name,value", [
    ("num_user", "nan"), ("seed", "abc"), ("seed", 2.5), ("num_candidates", True), ("layer", 0.5),
    ("cap_method", "bogus"), ("preset", "x" * 5000), ("head", 99), ("head", "two"), ("values", 3),
    ("batch_size", 9), ("row", 1),
])
def test_settings_endpoint_component_checks_name_the_field(client, name, value):
    """Values Gradio's components would round (2.5 -> 2, True -> 1) or refuse without a field name."""
    assert_names_field(refused(client, "/settings", *control_values(**{name: value})), name)


def test_head_takes_the_documented_string_form(client, endpoints):
    """The API docs list the head dropdown's choices as strings ('-1', '0', ...); those work too."""
    head = next(p for p in endpoints["/settings"]["parameters"] if p["label"] == "head")
    documented = head["python_type"]["type"]
    assert "'2'" in documented, documented
    assert "head=2" in client.predict(*control_values(head="2"), api_name="/settings")
    assert_names_field(refused(client, "/settings", *control_values(head="9")), "head")


# --- the other endpoints, argument by argument ---------------------------------------------------

@pytest.mark.parametrize("lengths", ["1e30", "-5, 10", "0", "100000", "x" * 10_000, "nan", "8," * 2000, 12.5,
                                     None])
def test_timing_refuses_bad_lengths_by_name(client, lengths):
    assert_names_field(refused(client, "/timing", "preset=lecture", lengths, ["naive"]), "lengths")


def test_timing_refuses_bad_query_by_name(client):
    assert_names_field(refused(client, "/timing", "num_history=inf", "8", ["naive"]), "num_history")


@pytest.mark.parametrize("api,args,field", [
    ("/timing", ("preset=lecture", "8", ["bogus"]), "backends"),
    ("/timing", ("preset=lecture", "8", "naive"), "backends"),
    ("/export_figure", ("preset=lecture", "nope", "png"), "figure"),
    ("/export_figure", ("preset=lecture", ["mask"], "png"), "figure"),
    ("/export_figure", ("preset=lecture", "mask", "gif"), "format"),
    ("/export_figure", ("preset=lecture", "mask", "png", "3:2"), "aspect"),
    ("/lecture_pack", ("preset=lecture", ["16:9"]), "aspect"),
])
def test_timing_and_export_choices_name_the_field(client, api, args, field):
    assert_names_field(refused(client, api, *args), field)


def test_export_refuses_bad_query_by_name(client):
    assert_names_field(refused(client, "/export_figure", "seed=-1", "mask", "png"), "seed")
    assert_names_field(refused(client, "/lecture_pack", "x" * 100_000), "query string")


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory):
    """A file that is no archive, and a real weight file for another geometry."""
    import torch
    from models.presets import get_preset
    from models.recsys import RecsysModel, init_recsys
    from models.weights import save_weights
    d = tmp_path_factory.mktemp("weights")
    (d / "garbage.npz").write_bytes(b"not a zip archive" * 10)
    preset = get_preset("lecture")
    other = RecsysModel(preset.recsys_config(preset.transformer.replace(emb_size=32, num_layers=1)))
    with torch.no_grad():
        save_weights(init_recsys(other, "random", 0), d / "other-geometry.npz")
    (d / "weights.pkl").write_bytes(b"\x80\x04N.")
    return d


def test_upload_refuses_bad_files_by_name_and_keeps_the_weights(client, weight_files):
    handle = gradio_client.handle_file
    before = client.predict("preset=lecture&weights=random", api_name="/mask")
    assert_names_field(refused(client, "/upload_weights", "preset=lecture&weights=random", None), "weights file")
    for not_uploaded in ("/etc/passwd", str(weight_files / "garbage.npz"), 5):    # paths on the server
        assert_names_field(refused(client, "/upload_weights", "preset=lecture", not_uploaded), "weights file")
    assert_names_field(refused(client, "/upload_weights", "preset=lecture&weights=random",
                               handle(str(weight_files / "garbage.npz"))), "weights file")
    text = refused(client, "/upload_weights", "preset=lecture&weights=random",
                   handle(str(weight_files / "other-geometry.npz")))
    assert_names_field(text, "weights file")
    assert text.count("shape") + text.count("missing") + text.count("unexpected") >= 2, \
        f"the message should list every mismatch: {text[:500]!r}"
    assert_names_field(refused(client, "/upload_weights", "num_history=inf",
                               handle(str(weight_files / "garbage.npz"))), "num_history")
    # a pickle never reaches the server's loader; Gradio's file-type check refuses it
    text = refused(client, "/upload_weights", "preset=lecture", handle(str(weight_files / "weights.pkl")))
    assert ".npz" in text and ".safetensors" in text
    after = client.predict("preset=lecture&weights=random", api_name="/mask")
    assert after[1] == before[1], "a refused upload changed what the views show"


def test_every_named_endpoint_is_covered(endpoints):
    """A new endpoint on the API page must get fuzz cases here (or take no input at all); the page's own
    unlisted steps are fuzzed here when they take a query string (test_every_other_query_endpoint...)."""
    no_input = {api for api, e in endpoints.items() if not e["parameters"]}
    unlisted = {api for api, e in endpoints.items() if e.get("api_visibility", "public") != "public"}
    missing = set(endpoints) - set(BY_ARGUMENT) - set(query_endpoints(endpoints)) - no_input - unlisted
    assert not missing, f"endpoints without fuzz cases: {sorted(missing)}"


@pytest.mark.parametrize("preset", ["nope", 5, None])
def test_preset_endpoint_names_the_field(client, preset):
    assert_names_field(refused(client, "/preset", preset), "preset")


@pytest.mark.parametrize("query,family,field", [("preset=lecture", "nope", "family"), ("preset=lecture", None, "family"),
                                                 ("num_candidates=nan", "xrex", "num_candidates")])
def test_family_endpoint_names_the_field(client, query, family, field):
    assert_names_field(refused(client, "/family", query, family), field)


# --- and afterwards the server still answers ------------------------------------------------------

def test_server_still_answers_every_view_afterwards(client, endpoints):
    for api, e in endpoints.items():
        if not e["parameters"]:
            client.predict(api_name=api)
    query = "preset=lecture&weights=random&num_candidates=4"
    for api in VIEWS:
        out = client.predict(query, api_name=api)
        assert len(out) == len(endpoints[api]["returns"]) and out[0] is not None
    first, again = (client.predict(query, api_name="/invariance") for _ in range(2))
    assert again[1] == first[1] and again[4] == first[4]                 # deterministic for a config + seed
    assert client.predict("phoenix-nano", api_name="/preset").startswith("preset=phoenix-nano")
    assert "weights=random" in client.predict(*control_values(), api_name="/settings")
    changed = client.predict(*control_values(num_candidates=4), "attention", api_name="/control_change")
    assert changed[0] == "preset=lecture&num_candidates=4&weights=random" and changed[4] is not None  # attention figure
