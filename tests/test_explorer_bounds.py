"""Every request bounded before it starts: work and memory estimated from the settings and refused by
name past the device's budget; caches sized in bytes under one ceiling; probes whose work grows with T
run on a capped layout; no process-wide state changed inside a request."""
import os
import threading
import time
from dataclasses import replace

import pytest
import torch

from explorer import budget, limits, runs, views
from explorer.limits import check_budget, estimate_params
from explorer.query_string import parse_query
from explorer.schema import ValidationError
from explorer.views import VIEWS, check_view, drawn_views


def view_cost(s, view):
    return VIEWS[view].estimate(s)


def device_budget(s, view):
    return check_budget(s, view, VIEWS[view].estimate)
from models.bugzoo import with_bug
from models.grok import Transformer
from models.probes import capped_layout, perturb, causality_probe, run_probe
from models.recsys import RecsysModel
from tolerances import forward_bound

# --- the parameter estimate is the model's own count ------------------------------------------

@pytest.mark.parametrize("query", ["preset=lecture", "preset=lecture&weights=random&num_user=8",
                                   "preset=lecture-003&num_user=4&emb_size=96",
                                   "preset=lecture&weights=random&widening_factor=1.5&num_q_heads=6&num_kv_heads=3"])
def test_estimate_params_is_the_built_models_parameter_count(query):
    s = parse_query(query)
    assert estimate_params(s) == sum(p.numel() for p in RecsysModel(s.recsys_config()).parameters())


@pytest.mark.parametrize("query", ["preset=phoenix-2026-nano", "preset=phoenix-2026-seqpack&emb_size=96&num_layers=2",
                                   "preset=lecture&family=xrex&widening_factor=1.5&num_user=3"])
def test_estimate_params_of_the_production_family_is_its_models_count(query):
    """Production's ranker has a plain 2x MLP, merged qkv, qk_norm scales and 64 heads: grok.py's count
    (the estimate before) is not its size."""
    from explorer.runs import build_model
    s = parse_query(query, need_model=False)
    assert estimate_params(s) == sum(p.numel() for p in build_model(s).parameters())


def test_a_model_over_the_cap_only_through_num_user_is_refused_by_name():
    """emb 1024 with 8 user tokens is ~55M parameters, over the 40M CPU cap, counting num_user's
    projection (without it the estimate is 39M)."""
    with pytest.raises(ValidationError, match=r"emb_size: got 1024; allowed: a model of at most 40M .* about 55M"):
        parse_query("preset=phoenix-nano&num_user=8&emb_size=1024&num_history=100")


# --- every view states its cost and is refused past the budget, before any forward -----------

def test_view_costs_grow_with_the_work_they_do():
    s = parse_query("preset=lecture&weights=random&num_history=60")
    longer = replace(s, num_history=120)
    for view in [v.name for v in drawn_views()][1:]:
        a, b = view_cost(s, view), view_cost(longer, view)
        assert 0 < a.flops < b.flops and 0 < a.peak_bytes < b.peak_bytes, view
    assert view_cost(s, "isolation").forwards > view_cost(s, "attention").forwards
    with pytest.raises(ValidationError, match="view: got 'nope'"):
        check_view("nope")


@pytest.mark.parametrize("view", ["attention", "anatomy", "isolation", "invariance", "variants"])
def test_a_request_past_the_budget_is_refused_by_name_before_it_runs(monkeypatch, view):
    monkeypatch.setattr(limits, "CPU_MAX_REQUEST_FLOPS", 1e6)
    s = parse_query("preset=lecture&weights=random&seed=77&num_history=40")
    runs.clear_caches()
    with pytest.raises(ValidationError, match=rf"^(batch_size|num_history|num_candidates|num_layers|num_q_heads|"
                                              rf"emb_size): got \d+; allowed: a smaller value: the {view} view would run"):
        VIEWS[view].draw(s)
    assert budget.MEMORY.cached == 0 and not any(c.entries for c in budget.MEMORY.caches)   # nothing ran


def test_cap_sized_isolation_is_refused_by_its_memory_and_the_attention_view_is_not():
    """56 query heads at T 1087 record ~505 MiB per forward; the isolation probe holds several of them
    at once."""
    s = parse_query("preset=phoenix-nano&num_q_heads=56&num_kv_heads=8&num_layers=1")
    assert device_budget(s, "attention").peak_bytes < limits.max_request_bytes()
    with pytest.raises(ValidationError, match=r"MiB, \d\.\dx this CPU's budget"):
        device_budget(s, "isolation")


def test_the_bug_zoo_budget_holds_at_phoenix_nano():
    assert device_budget(parse_query("preset=phoenix-nano"), "variants").flops < limits.CPU_MAX_REQUEST_FLOPS


@pytest.mark.parametrize("preset", ["phoenix-prod", "phoenix-2026"])
def test_a_gpu_allows_every_view_at_the_production_presets(preset, monkeypatch):
    """On a GPU the models' weights, passes and recorded attention live in its own memory, budgeted apart
    from the host's (the default 4 GiB, EXPLORER_MEMORY_BYTES, stays the host's): on an 80 GB one every view
    at the production presets is allowed (phoenix-prod's attention view holds ~3.6 GiB, past the 2 GiB a
    request may hold of a 4 GiB ceiling); on a 16 GB one the largest are refused by name, saying which
    memory; EXPLORER_DEVICE_MEMORY_BYTES sets the GPU's ceiling."""
    for name in ("EXPLORER_MEMORY_BYTES", "EXPLORER_DEVICE_MEMORY_BYTES"):      # the defaults
        monkeypatch.delenv(name, raising=False)
    with limits.limits_of("cuda"):                           # a stand-in of an H100's 80 GB
        s = parse_query(f"preset={preset}")
        allowed = {view.name: device_budget(s, view.name) for view in drawn_views()}
        for view in drawn_views():
            cost = allowed[view.name]
            host, dev = limits.request_bytes(cost)
            assert dev == cost.device_bytes >= (limits.model_bytes(s) if view.needs_model else 0)
            assert host == cost.host_bytes
            assert host + dev >= cost.peak_bytes and host < 2**30, view.name     # figures and masks
        assert view_cost(s, "attention").peak_bytes > limits.max_request_bytes()        # refused before
    with limits.limits_of("cuda", device_memory=16 * 10**9):
        device_budget(s, "attention")
        with pytest.raises(ValidationError, match=r"MiB of GPU memory and \d+ MiB of host memory, \d\.\dx this CUDA"):
            device_budget(s, "variants")
        monkeypatch.setenv("EXPLORER_DEVICE_MEMORY_BYTES", "4e9")
        assert limits.device_memory_ceiling() == 4 * 10**9
        with pytest.raises(ValidationError, match="this CUDA's budget"):
            device_budget(s, "attention")


def test_a_cpu_keeps_one_memory_for_its_requests(monkeypatch):
    """On a CPU a request's whole peak is counted in the one ceiling, the models' part included, as before
    there was a GPU account: a request that fits beside the weights on a GPU is refused here."""
    s = parse_query("preset=phoenix-nano&num_q_heads=56&num_kv_heads=8&num_layers=1")
    cost = view_cost(s, "isolation")
    assert not limits.device_memory_apart() and limits.request_bytes(cost) == (cost.peak_bytes, 0)
    assert cost.host_bytes < limits.max_request_bytes() < cost.peak_bytes
    with pytest.raises(ValidationError, match=r"holding [\d,]+ MiB, \d\.\dx this CPU's budget per request of "
                                              r"[\d,]+ GFLOP and 2,048 MiB$"):
        device_budget(s, "isolation")


# --- the causality probe: batched, exact, and capped ---------------------------------------------

def one_at_a_time(model, x, mask, off):
    """The probe as first written: one forward per perturbed position (the reference)."""
    before = model(x, mask, off).embeddings
    worst = 0.0
    for p in range(1, x.shape[1]):
        after = model(perturb(x, p, "noise", 1.0, p), mask, off).embeddings
        earlier = mask[:, :p]
        if earlier.any():
            worst = max(worst, float((after - before)[:, :p].abs().amax(-1)[earlier].max()))
    return worst


def lecture_trunk_inputs(T=11, offset=7):
    model = Transformer(parse_query("preset=lecture").transformer_config())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(2, T, model.config.emb_size, generator=g)
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, 3] = False
    return model, x, mask, offset


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_batched_causality_probe_agrees_with_one_forward_per_position(chunk):
    model, x, mask, off = lecture_trunk_inputs()
    assert causality_probe(model, x, mask, off, chunk=chunk) == 0.0           # exact, not fp32 rounding
    buggy = with_bug(model, "unmasked-decoder")
    with torch.no_grad():
        expected = one_at_a_time(buggy, x, mask, off)
        scale = buggy(x, mask, off).embeddings.abs().max().item()
    # batching changes only how fp32 sums are blocked: each of the two outputs a change compares may round
    c = model.config
    bound = 2 * forward_bound(c.num_layers, c.emb_size, c.ffn_hidden, x.shape[1]) * scale
    assert expected > bound
    assert abs(causality_probe(buggy, x, mask, off, chunk=chunk) - expected) <= bound


def test_capped_layout_keeps_prefix_and_candidates():
    x = torch.arange(20.0)[None, :, None].expand(1, 20, 4)
    mask = torch.ones(1, 20, dtype=torch.bool)
    cx, cmask, off = capped_layout(x, mask, 14, 8)
    assert cx[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 14, 15] and off == 6 and cmask.shape == (1, 8)
    assert capped_layout(x, mask, None, 8)[0].shape[1] == 8
    assert capped_layout(x, mask, 14, 64)[0] is x                             # short inputs untouched


def test_run_probe_says_how_many_positions_the_capped_probe_saw():
    model, x, mask, off = lecture_trunk_inputs(T=40, offset=30)
    r = run_probe("causality", with_bug(model, "unmasked-decoder"), x, mask, off)
    assert r.flagged and r.positions == 16
    assert run_probe("isolation", model, x, mask, off).positions == 40


def test_bug_zoo_work_is_bounded_whatever_the_length(monkeypatch):
    """Count every token row the trunk processes for the bug zoo (6 models): at T 304 it stays within a
    few full forwards' worth, not T-1 per model."""
    seen = []
    forward = Transformer.forward

    def counting(self, embeddings, *a, **k):
        seen.append(embeddings.shape[0] * embeddings.shape[1])
        return forward(self, embeddings, *a, **k)
    s = parse_query("preset=lecture&weights=random&num_history=300&seed=5")
    runs.forward(s)
    monkeypatch.setattr(Transformer, "forward", counting)
    fig, text = views.bug_zoo_view(s)
    assert sum(seen) <= 25 * s.seq_len, (sum(seen), len(seen))           # was ~1800 x T
    assert "capped layout" in text and "causality on 16" in text and "isolation and parity on 128" in text


# --- invariance: the operations that crashed -------------------------------------------------------

def test_add_draws_the_new_candidate_from_the_models_vocabulary():
    """'add' on the demo weights draws hashes inside the demo world's vocabulary."""
    s = parse_query("preset=lecture&operation=add&rope_mode=none")
    new, pairs = views.changed_batch(s, runs.batch_for(s))
    vocab = runs.build_model(s).config.hash_vocab_size
    assert int(new.candidate_post_hashes.max()) < vocab and int(new.candidate_author_hashes.max()) < vocab
    before, after, _ = views.invariance(s)
    assert abs(after - before).max() < views.FP32_TOLERANCE                  # no RoPE: adding moves nothing


def test_dropping_the_only_candidate_says_so():
    """Dropping the only candidate leaves an empty order: answered in words, not an index error."""
    fig, text = views.invariance_view(parse_query("preset=lecture&num_candidates=1&operation=drop"))
    assert "leaves no candidate" in text


# --- caches in bytes under one ceiling, one lock per entry, threads set once ------------------------

def test_caches_evict_by_bytes_under_the_ceiling(monkeypatch):
    monkeypatch.setattr(budget, "memory_ceiling", lambda: 10_000)
    monkeypatch.setattr(budget.MEMORY, "outside", {})     # an export test's browser, counted outside the caches
    runs.clear_caches()
    cache = budget.ByteCache(lambda i: torch.zeros(1000))                        # 4000 bytes each
    for i in range(5):
        cache(i)
    assert budget.MEMORY.cached <= 10_000 and sorted(cache.entries) == [(3,), (4,)]
    cache(3)                                                                   # used: now the newest
    cache(5)
    assert sorted(cache.entries) == [(3,), (5,)]
    budget.MEMORY.caches.remove(cache)
    runs.clear_caches()


def test_running_requests_share_the_ceiling_with_the_caches(monkeypatch):
    monkeypatch.setattr(budget, "memory_ceiling", lambda: 10_000)
    order = []

    def request(name, size, hold):
        with budget.MEMORY.reserve(size):
            order.append(f"{name} start")
            time.sleep(hold)
            order.append(f"{name} end")
    a = threading.Thread(target=request, args=("a", 7000, 0.3))
    a.start()
    time.sleep(0.05)
    request("b", 7000, 0)                                                      # waits for a to finish
    a.join()
    assert order == ["a start", "a end", "b start", "b end"]


def test_a_gpus_memory_is_its_own_account(monkeypatch):
    """Cache entries and requests in a GPU's memory (here the meta device stands in: not the host's) are
    counted under the GPU's ceiling: host pressure evicts host entries only and leaves the GPU's weights;
    the GPU's ceiling evicts its own least recently used; an idle trim frees host memory alone."""
    memory = budget.Memory()
    monkeypatch.setattr(budget, "MEMORY", memory)
    monkeypatch.setattr(budget, "memory_ceiling", lambda: 10_000)
    monkeypatch.setattr(budget, "device_memory_ceiling", lambda: 100_000)
    cache = budget.ByteCache(lambda where, n: torch.empty(n, dtype=torch.uint8, device=where))
    cache("meta", 40_000)
    cache("cpu", 6_000)
    cache("meta", 40_001)
    assert (memory.cached, memory.cached_device) == (6_000, 80_001)
    cache("cpu", 6_001)                                      # the host's ceiling: its oldest entry goes
    assert sorted(cache.entries) == [("cpu", 6_001), ("meta", 40_000), ("meta", 40_001)]
    cache("meta", 40_002)                                    # the GPU's ceiling: its oldest goes
    assert sorted(cache.entries) == [("cpu", 6_001), ("meta", 40_001), ("meta", 40_002)]
    with memory.reserve(100, device_size=50_000):            # a request's passes evict the GPU's caches
        assert (memory.reserved, memory.reserved_device) == (100, 50_000)
        assert sorted(cache.entries) == [("cpu", 6_001), ("meta", 40_002)]
    assert memory.trim_if_idle(0.0, 0)
    assert sorted(cache.entries) == [("meta", 40_002)] and (memory.cached, memory.cached_device) == (0, 40_002)


def test_a_request_on_a_gpu_reserves_each_memory_apart(monkeypatch):
    """within_budget reserves a request's host bytes and its GPU bytes (limits.request_bytes); on a CPU its
    whole peak in the one memory."""
    seen = []
    real = budget.MEMORY.reserve
    monkeypatch.setattr(budget.MEMORY, "reserve", lambda *sizes: seen.append(sizes) or real(*sizes))
    cost = limits.Cost(1, 1.0, peak_bytes=3_000, device_bytes=2_000)
    budget.within_budget(cost, lambda: None)
    with limits.limits_of("cuda"):
        budget.within_budget(cost, lambda: None)
    assert seen == [(3_000, 0), (1_000, 2_000)]
    assert (cost + limits.Cost(peak_bytes=2_500)).host_bytes == 2_500
    assert cost.holding(10, on_device=True).device_bytes == 2_010 and cost.holding(10).host_bytes == 1_010


def test_a_small_request_never_waits_behind_large_ones(monkeypatch):
    """The lecture /mask (14 ms alone) waited seconds in the abuse soak for cap-sized probe passes
    holding the ceiling to finish; a request of at most small_request_bytes runs at once."""
    monkeypatch.setattr(budget, "memory_ceiling", lambda: 32_000)
    order, holding = [], threading.Event()

    def large():
        with budget.MEMORY.reserve(30_000):
            holding.set()
            time.sleep(0.5)
            order.append("large end")
    t = threading.Thread(target=large)
    t.start()
    holding.wait()
    with budget.MEMORY.reserve(budget.small_request_bytes()):
        order.append("small ran")
    t.join()
    assert order == ["small ran", "large end"]


def test_the_mask_view_is_small_at_every_layout_the_device_allows():
    """...so the mask view never waits for memory, even at the longest layout (default ceiling)."""
    s = parse_query(f"preset=phoenix-nano&num_history={limits.max_seq_len() - 65}", need_model=False)
    assert s.seq_len == limits.max_seq_len()
    assert view_cost(s, "mask").peak_bytes <= budget.small_request_bytes()


def test_one_lock_per_cache_entry(monkeypatch):
    calls, b_began, side_by_side = [], threading.Event(), []

    def slow(key):
        calls.append(key)
        if key == "a":              # a waits for b to begin: with one lock for the whole cache, b never would
            side_by_side.append(b_began.wait(10))
        else:
            b_began.set()
        return torch.zeros(1)
    cache = budget.ByteCache(slow)
    first = threading.Thread(target=cache, args=("a",))
    first.start()
    while not calls:
        time.sleep(0.01)
    threads = [threading.Thread(target=cache, args=(k,)) for k in ("b", "a")]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join()
    assert side_by_side == [True]                                              # a and b ran side by side
    assert sorted(calls) == ["a", "b"]                                         # the second a waited for the first
    budget.MEMORY.caches.remove(cache)


def test_views_never_change_the_process_thread_count(monkeypatch):
    """No view calls torch.set_num_threads: concurrent workers share the process's thread count."""
    def forbidden(n):
        raise AssertionError("torch.set_num_threads inside a request")
    runs.clear_caches()
    monkeypatch.setattr(torch, "set_num_threads", forbidden)
    s = parse_query("preset=lecture&seed=9")
    views.attention_view(s), views.isolation_view(s), views.invariance_view(s), views.bug_zoo_view(s)


def test_memory_ceiling_from_the_environment(monkeypatch):
    monkeypatch.setenv(limits.MEMORY_CEILING_ENV, "6e9")
    assert limits.memory_ceiling() == 6_000_000_000 and limits.max_request_bytes() == 3_000_000_000
    monkeypatch.setenv(limits.MEMORY_CEILING_ENV, "lots")
    with pytest.raises(ValidationError, match="EXPLORER_MEMORY_BYTES: got 'lots'"):
        limits.memory_ceiling()


def test_an_idle_server_shrinks_its_caches_and_returns_the_memory(monkeypatch):
    """After load the caches may hold up to the ceiling; once no request has run for IDLE_TRIM_S
    they shrink to IDLE_KEEP_BYTES, least recently used first, and only once per idle spell."""
    memory = budget.Memory()
    monkeypatch.setattr(budget, "MEMORY", memory)
    cache = budget.ByteCache(lambda n: torch.zeros(n, dtype=torch.uint8))
    for n in (4000, 3000, 2000):                         # oldest first
        cache.entries[(n,)] = torch.zeros(n, dtype=torch.uint8)
        memory.add(cache, (n,), n)
    with memory.reserve(10):                             # a request ran just now
        assert not memory.trim_if_idle(0.0, 2500)        # ... and is still running: never trimmed
    assert not memory.trim_if_idle(60.0, 2500)           # not idle long enough
    assert memory.trim_if_idle(0.0, 2500)
    assert list(cache.entries) == [(2000,)] and memory.cached == 2000
    assert not memory.trim_if_idle(0.0, 0)               # once per idle spell
    with memory.reserve(10):
        pass
    assert memory.trim_if_idle(0.0, 0) and memory.cached == 0 and not cache.entries


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread priority is Linux's")
def test_large_views_run_at_a_lower_cpu_priority_and_small_ones_do_not(monkeypatch):
    """A large view (phoenix-nano, tens of GFLOP) runs on a thread of nice +19 so that small ones
    (lecture, a few MFLOP) keep their share of a 2-core Space's CPU; its result and errors come
    back unchanged, and a view nested in it does not reserve memory twice."""
    seen = {}

    def priority():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def bounded(fn):
        return lambda s: budget.within_budget(view_cost(s, "attention"), lambda: fn(s))

    @bounded
    def inner(s):
        seen["nested"] = priority()
        return "inner"

    @bounded
    def view(s):
        seen[s.preset] = priority()
        if s.preset == "phoenix-nano":
            assert inner(s) == "inner"
            raise KeyError("from the view")
        return s.preset
    base = priority()
    assert view(parse_query("preset=lecture")) == "lecture"
    with pytest.raises(KeyError, match="from the view"):
        view(parse_query("preset=phoenix-nano"))
    assert seen["lecture"] == base
    assert seen["phoenix-nano"] == seen["nested"] == min(19, base + budget.LOW_PRIORITY_NICE)
    assert budget.MEMORY.reserved == 0


def test_low_priority_work_runs_in_its_callers_context():
    """A view moved to a low-priority thread asks about its own request (budget.check_wanted reads the caller's
    context, Gradio's event id): a context variable the caller set is seen there, and the caller's stays."""
    import contextvars
    from explorer import budget
    request = contextvars.ContextVar("request")
    token = request.set("mine")
    try:
        assert budget.on_low_priority(request.get, None) == "mine"
        assert budget.on_low_priority(lambda: request.set("theirs") and request.get()) == "theirs"
        assert request.get() == "mine"
    finally:
        request.reset(token)
