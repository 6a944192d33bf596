"""Device-correctness without a GPU: the `meta` device refuses what a CUDA forward must never do.

A meta tensor has a shape and a device but no data, so mixing it with a CPU tensor raises ("is not on
the expected device cpu") and reading it back raises ("cannot be called on meta tensors"). A forward
that runs on meta therefore builds every mask on the inputs' device and makes no host sync — the two
faults that made every view of a GPU Space fail (models/masks.py built its index ranges on the CPU and
`&`-ed them with a CUDA `valid`; has_padding read `valid.all()` back in every layer)."""
import functools

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_backends
from models import attention as A
from models.bugzoo import bug_names, with_bug
from models.grok import Transformer, init_params
from models.masks import AttentionMask
from models.presets import get_preset
from models.probes import isolation_probe
from models.recsys import RecsysModel, SequenceLayout, init_recsys, synthetic_batch
from models.xrex import XrexConfig, XrexRanker, XrexRecsys, XrexTrunk, init_xrex
from tolerances import storage_forward_bound

META = torch.device("meta")


def padded_valid(B, T, offset):
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, offset - 2:offset] = False
    valid[1, T - 1] = False
    return valid


def meta_trunk(**changes):
    config = get_preset("lecture").transformer.replace(**changes)
    return init_params(Transformer(config), "random", seed=1).to(META)


@pytest.mark.parametrize("prefix", ["causal", "bidirectional"])
@pytest.mark.parametrize("backend,cap_method", [("naive", "tanh"), ("structured", "soft_sign"), ("sdpa", "none")])
def test_trunk_forward_with_padding_runs_on_meta(prefix, backend, cap_method):
    model = meta_trunk(prefix=prefix, cap_method=cap_method)
    emb = torch.randn(2, 9, 64).to(META)
    valid = padded_valid(2, 9, 6).to(META)
    with torch.no_grad():
        out = model(emb, valid, 6, backend=backend, record=backend == "naive")
    assert out.embeddings.device == META and out.embeddings.shape == (2, 9, 64)


def test_ranker_forward_with_padding_runs_on_meta():
    preset = get_preset("lecture")
    config = preset.recsys_config(preset.transformer.replace(prefix="bidirectional"))
    model = init_recsys(RecsysModel(config), "random", seed=2).to(META)
    batch = synthetic_batch(config, SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1), seed=5, batch=2)
    batch = type(batch)(*(getattr(batch, f).to(META) for f in batch.__dataclass_fields__))
    with torch.no_grad():
        out = model(batch, record=True)
    assert out.logits.device == META and out.logits.shape[:2] == (2, 4)


def test_attention_mask_forms_are_built_on_meta():
    mask = AttentionMask("recsys", 11, 7, padded_valid(2, 11, 7).to(META))
    assert mask.padded                                        # known from the layout, not read back
    assert mask.dense(META).device == META
    full_cnt, full_idx, part_cnt, part_idx = mask.tiles(4, 4, META).block_sparse()
    assert {t.device for t in (full_cnt, full_idx, part_cnt, part_idx)} == {META}


def test_flash_wrappers_make_no_host_read(monkeypatch):
    """The varlen packing (FlashAttention 2) and the block-sparse tensors (FlashAttention-4) run on meta
    around shape-only kernels: neither wrapper reads a count, an offset or a mask back."""
    def shape_only_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                          softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                          alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        return torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32), None

    def shape_only_fa4(q, k, v, softmax_scale=None, causal=False, softcap=0.0, pack_gqa=None, mask_mod=None,
                       aux_tensors=None, block_sparse_tensors=None):
        assert all(t.device == META for t in block_sparse_tensors[:4]) and mask_mod is not None
        return torch.empty_like(q), None
    monkeypatch.setattr(A, "_flash_attn_funcs", lambda: (None, shape_only_varlen))
    monkeypatch.setattr(A, "_fa4_func", lambda: (shape_only_fa4, lambda **kw: tuple(kw.values())))
    monkeypatch.setattr(A, "_fa4_mask_mod", lambda *a: (lambda *args: None))
    monkeypatch.setattr(A, "_fa4_block_q", lambda device: 4)
    q, k, v = (torch.randn(2, 11, h, 8).to(META) for h in (4, 2, 2))
    mask = AttentionMask("recsys", 11, 7, padded_valid(2, 11, 7).to(META))
    for fn in (A.flash_attn_attention, A.fa4_attention):
        out = fn(q, k, v, mask, multiplier=1.0, cap=30.0, cap_method="tanh").out
        assert out.device == META and out.shape == q.shape


def test_isolation_probe_keeps_every_tensor_on_the_model_device():
    """On meta the probe gets as far as its one deliberate host read — the number it returns."""
    model = meta_trunk()
    emb = torch.randn(2, 9, 64).to(META)
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors") as raised:
        isolation_probe(model, emb, padded_valid(2, 9, 6).to(META), 6, candidate=1)
    frames = [str(entry.path) for entry in raised.traceback]
    ours = [f for f in frames if "/models/" in f]
    assert ours[-1].endswith("probes.py"), ours          # raised by the probe's float(), not inside a forward


# --- the whole trunk in bf16 on every backend: on CPU (CI) and on a GPU (marked gpu, skipped without CUDA) ---

GPU_PRESETS = ["lecture", "phoenix-nano", "phoenix-prod"]
CPU_PRESETS = ["lecture", "phoenix-nano"]        # phoenix-prod in bf16 takes minutes per backend on a CPU
COMPILED = {"flex", "fa4"}
COMPILED_CASE = ("phoenix-nano", "tanh", "bidirectional")     # a compile per layout: one case each
RAN: dict = {"cpu": set(), "cuda": set()}          # every backend a trunk case ran in this session, per device
ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@functools.lru_cache(maxsize=1)
def trunk_weights(preset: str, device: str) -> dict:
    """The preset's seeded random weights in bf16 on `device`, drawn once for the cases that share them (the cap
    method and the prefix are no weights): phoenix-prod's 336 M draws take 8-15 s of one CPU thread, four times
    in the GPU session's test budget."""
    return init_params(Transformer(get_preset(preset).transformer), "random", seed=1).to(device, torch.bfloat16
                                                                                           ).state_dict()


def trunk_inputs(preset: str, device: str = "cuda", B: int = 2, **changes):
    """The preset's trunk (random weights) in bf16 on `device` with a padded batch: (model, emb, valid, offset)."""
    p = get_preset(preset)
    with torch.device("meta"):                          # no weights drawn: the shared ones are assigned
        model = Transformer(p.transformer.replace(**changes))
    model.load_state_dict(trunk_weights(preset, device), assign=True)
    model = model.eval()
    T, off = p.layout.seq_len, p.layout.candidate_start_offset
    emb = torch.randn(B, T, p.transformer.emb_size, generator=torch.Generator().manual_seed(3))
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, off - 2:off] = False                       # history padding
    valid[1, T - 1] = False                             # candidate padding
    return model, emb.to(device, torch.bfloat16), valid.to(device), off


def trunk_refusal(device: str):
    """Why the trunk cases (bf16, recsys masks with key padding; the cap on or off) cannot run a backend here."""
    return lambda name: A.unavailable_reason(name, device=device, dtype="bfloat16", cap_method="none",
                                             mask_kind="recsys", padding=True)


def trunk_backends_match_naive(model, emb, valid, off, compiled: bool) -> list[str]:
    """Every backend that runs this trunk here, through the whole model against naive in the same dtype, within
    storage_forward_bound -> the backends that ran, naive (the reference) first. `compiled`: flex and fa4 too."""
    c = model.config
    with torch.no_grad():
        recorded = model(emb, valid, off, record=True)
        ref = recorded.embeddings.float()
        logit_max = max(float(layer.logits.float().abs().max()) for layer in recorded.layers)
        bound = storage_forward_bound(c.num_layers, c.emb_size, c.ffn_hidden, emb.shape[1], logit_max=logit_max)
        ran = ["naive"]
        for backend in A.BACKENDS:
            if backend == "naive" or (backend in COMPILED and not compiled) or A.unavailable_reason(
                    backend, device=emb.device.type, dtype="bfloat16", cap=c.logit_cap, cap_method=c.cap_method,
                    mask_kind=model.attention_mask(valid, off).kind, padding=True, head_dim=c.key_size):
                continue
            out = model(emb, valid, off, backend=backend).embeddings.float()
            err = float((out - ref)[valid].abs().max() / ref[valid].abs().max())
            assert err <= bound, (backend, err, bound)
            ran.append(backend)
    return ran


@pytest.mark.parametrize("device,preset", [("cpu", p) for p in CPU_PRESETS]
                         + [pytest.param("cuda", p, marks=ON_CUDA) for p in GPU_PRESETS])
@pytest.mark.parametrize("cap_method", ["tanh", "none"])
@pytest.mark.parametrize("prefix", ["causal", "bidirectional"])
def test_trunk_every_backend_matches_naive(device, preset, cap_method, prefix):
    model, emb, valid, off = trunk_inputs(preset, device, cap_method=cap_method, prefix=prefix)
    ran = trunk_backends_match_naive(model, emb, valid, off, compiled=(preset, cap_method, prefix) == COMPILED_CASE)
    assert "structured" in ran
    RAN[device].update(ran)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA)])
def test_trunk_every_loaded_backend_ran(device):
    """After the trunk cases above (file order): every backend that loads here, or that the GPU session
    requires, ran through the whole model at least once — naive, the reference of every case, included."""
    assert RAN[device], "run the whole file: no trunk case above ran in this session"
    assert gpu_backends.unexercised(RAN[device], device, refused=trunk_refusal(device)) == []


def test_a_trunk_case_counts_its_reference_as_run():
    """The bookkeeping on its own (the first H100 run failed on it: naive, the reference, was never recorded as
    run): one uncompiled CPU case reports naive and the plain-torch backends, and the check sees the rest missing."""
    ran = trunk_backends_match_naive(*trunk_inputs("lecture", "cpu", cap_method="none"), compiled=False)
    assert ran[0] == "naive" and {"structured", "sdpa"} <= set(ran)
    flex_runs = trunk_refusal("cpu")("flex") is None
    assert gpu_backends.unexercised(ran, "cpu", refused=trunk_refusal("cpu")) == [
        "flex loads here but no test on cpu ran it"] * flex_runs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", list(A.BACKENDS))
def test_cuda_forward_makes_no_host_sync(backend):
    """torch.cuda.set_sync_debug_mode('error') raises on any synchronising call (.item(), bool(), nonzero())."""
    cap_method = "none" if backend.startswith("sdpa") else "tanh"
    model, emb, valid, off = trunk_inputs("phoenix-nano", cap_method=cap_method)
    c = model.config
    if A.unavailable_reason(backend, device="cuda", dtype="bfloat16", cap=c.logit_cap, cap_method=c.cap_method,
                            mask_kind=model.attention_mask(valid, off).kind, padding=True, head_dim=c.key_size):
        pytest.skip(f"{backend} unavailable here")
    with torch.no_grad():
        model(emb, valid, off, backend=backend)          # warm-up: kernels load, caches fill
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(emb, valid, off, backend=backend)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_masks_are_built_on_the_device():
    mask = AttentionMask("recsys", 1088, 1024, padded_valid(2, 1088, 1024).cuda())
    assert mask.dense("cuda").is_cuda and mask.tiles(128, 128, "cuda").classes.is_cuda
    cpu = AttentionMask("recsys", 1088, 1024, padded_valid(2, 1088, 1024))
    assert torch.equal(mask.dense("cuda").cpu(), cpu.dense())
    assert torch.equal(mask.tiles(128, 128, "cuda").classes.cpu(), cpu.tiles(128, 128).classes)


# --- a link's seeded weights: drawn on the CPU's generator, the same bits on every torch version -------------

# sha256 over (name, bytes) of each parameter, sorted by name, of explorer.runs._initialised at these links, as
# torch 2.13 draws them on an x86-64 CPU with AVX2 or AVX-512 (torch's vectorised normal_ kernel; its scalar one,
# ATEN_CPU_CAPABILITY=default or a CPU without AVX2, draws other bits)
SEEDED_WEIGHTS = {"preset=lecture&weights=random":
                  "e6c0b889cfd071568830c5eef14ad1bdb1331c3ad851bbfb1983adf2b0251c44",
                  "preset=lecture&family=xrex&weights=random&seed=5":
                  "e51c3e819f176f0c8a4220b5ca2bc528c30fa7cc316b066cca40b4e86f28aded"}


@pytest.mark.parametrize("link", list(SEEDED_WEIGHTS))
@pytest.mark.parametrize("machine", ["here", pytest.param("gpu", marks=ON_CUDA)])    # the GPU image's torch: 2.11
def test_a_links_seeded_weights_are_the_same_bits_on_every_torch_version(machine, link):
    """A lecturer's link draws its random weights on the CPU's generator wherever the model then runs
    (explorer.runs._initialised), with models.grok.truncated_normal_ (torch 2.12's trunc_normal_ algorithm, in
    the repo): so a GPU machine whose torch is 2.11 — whose own trunc_normal_ drew other weights for a seed —
    shows the model a torch 2.13 Space shows. tests/test_grok.py checks the algorithm against torch's."""
    import hashlib

    from explorer import runs
    from explorer.query_string import parse_query
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("torch's scalar normal_ kernel draws other bits than its vectorised one")
    digest = hashlib.sha256()
    for name, value in sorted(runs._initialised(parse_query(link)).state_dict().items()):
        digest.update(name.encode())
        digest.update(value.contiguous().numpy().tobytes())
    assert digest.hexdigest() == SEEDED_WEIGHTS[link], f"torch {torch.__version__} drew other weights"


VIEW_PRESETS = GPU_PRESETS + ["phoenix-2026-nano", "phoenix-2026"]     # both families, every size


@pytest.mark.parametrize("device,preset", [("cpu", "lecture")]
                         + [pytest.param("cuda", p, marks=ON_CUDA) for p in VIEW_PRESETS])
def test_every_view_draws_on_the_device(device, preset, monkeypatch):
    """Every drawn view (explorer.views.VIEWS), as a request draws it, with the JSON of every figure: on a GPU at
    every GPU preset (the views keep each tensor on the explorer's device), on CPU at lecture. The memory
    ceilings are the defaults a Space runs with: on a GPU its own memory is budgeted apart from the host's 4 GiB
    (explorer.limits.device_memory_ceiling), so no production view is refused by budget on an 80 GB one."""
    pytest.importorskip("plotly")
    from explorer import views
    from explorer.query_string import parse_query
    for name in ("EXPLORER_MEMORY_BYTES", "EXPLORER_DEVICE_MEMORY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    s = parse_query(f"preset={preset}")
    for view in views.drawn_views():
        out = view.draw(s)
        assert out and all(o is not None for o in out), view.name
        for figure in out:
            getattr(figure, "to_json", lambda: None)()
    assert views.isolation_reading(s).isolated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("values", ["probabilities", "masked+logits"])
def test_cuda_heatmaps_are_pooled_on_the_device_to_the_hosts_bits(values, monkeypatch):
    """phoenix-nano's every-head grid (T 1087: pooled) is pooled where its forward lives
    (explorer.figures._pooled_on_device: no panel declined), and its JSON is byte for byte the figure the host's
    pooling draws from the same recorded forward. tests/test_explorer_figures.py checks the reduction on a CPU."""
    pytest.importorskip("plotly")
    from explorer import figures, views
    from explorer.query_string import parse_query
    s = parse_query(f"preset=phoenix-nano&values={values}")
    pooled, real = [], figures._pooled_exactly
    monkeypatch.setattr(figures, "_pooled_exactly", lambda *a: pooled.append(real(*a)) or pooled[-1])
    on_device = views.attention_view(s)[0].to_json()
    assert pooled and all(p is not None for p in pooled), "a panel was copied to the host to be pooled"
    monkeypatch.setattr(figures, "_pooled_on_device", lambda *a: None)
    assert views.attention_view(s)[0].to_json() == on_device


# --- no host tensor enters a forward: a CPU -> device copy is legal on meta, so watch every op -----------

class HostTensorWatch(TorchDispatchMode):
    """Records every op that takes a CPU tensor of more than one element and returns a meta tensor: on a
    GPU that is a host -> device copy inside the forward (a pageable copy syncs the stream). One-element
    CPU tensors (scalars wrapped by torch itself) are allowed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.device.type == "cpu" and t.numel() > 1 for t in inputs) and any(t.is_meta for t in outputs):
            self.seen.append(str(func))
        return out


def host_tensors_entering(forward) -> list[str]:
    with torch.no_grad(), HostTensorWatch() as watch:
        forward()
    return watch.seen


def xrex_meta_ranker(**changes):
    config = XrexConfig(emb_size=32, num_layers=2, num_q_heads=4, num_kv_heads=2, key_size=8,
                        num_user_prefix_tokens=2, history_seq_len=6, **changes)
    return init_xrex(XrexRanker(config), seed=1).to(META)


def grok_forwards():
    valid = padded_valid(2, 9, 6).to(META)
    emb = torch.randn(2, 9, 64).to(META)
    for prefix, backend, cap_method, bug in [("causal", "naive", "tanh", None), ("bidirectional", "structured", "tanh", None),
                                             ("causal", "sdpa", "none", None)] + [
            ("causal", "naive", "tanh", bug) for bug in bug_names("grok")]:
        model = with_bug(meta_trunk(prefix=prefix, cap_method=cap_method), bug)
        yield f"grok {backend} {bug}", lambda m=model, b=backend: m(emb, valid, 6, backend=b, record=b == "naive")


def xrex_forwards():
    valid = padded_valid(2, 12, 8).to(META)
    emb = torch.randn(2, 12, 32).to(META)
    for changes, backend, numerics in [({}, "naive", "fp32"), ({}, "structured", "bf16"),
                                       (dict(qk_norm=False, attn_logit_cap=5.0, attn_logit_cap_method="tanh"),
                                        "naive", "bf16")]:
        model = xrex_meta_ranker(**changes)
        yield f"xrex {backend} {numerics}", lambda m=model, b=backend, n=numerics: m(emb, valid, backend=b,
                                                                                    numerics=n, record=b == "naive")
    trunk = XrexTrunk(xrex_meta_ranker().config)
    trunk.ranker = xrex_meta_ranker()
    for bug in bug_names("xrex"):
        yield f"xrex {bug}", lambda m=with_bug(trunk, bug): m(emb, valid, 8, record=True)


def ranker_forwards():
    """The rankers from hashes: grok.py's RecsysModel and production's XrexRecsys on one meta batch."""
    preset = get_preset("lecture")
    config = preset.recsys_config(preset.transformer.replace(prefix="bidirectional"))
    batch = synthetic_batch(config, SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1), seed=5, batch=2)
    batch = type(batch)(*(getattr(batch, f).to(META) for f in batch.__dataclass_fields__))
    grok_ranker = init_recsys(RecsysModel(config), "random", seed=2).to(META)
    yield "grok ranker", lambda: grok_ranker(batch, record=True)
    xrex_config = XrexConfig(emb_size=32, num_layers=2, num_q_heads=4, num_kv_heads=2, key_size=8,
                             num_user_prefix_tokens=2, history_seq_len=6)
    xrex_ranker = init_params(XrexRecsys(xrex_config, hash_vocab_size=config.hash_vocab_size), "random", seed=2).to(META)
    yield "xrex ranker", lambda: xrex_ranker(batch, record=True)


@pytest.mark.parametrize("name,forward", [pytest.param(n, f, id=n) for n, f in
                                          (*grok_forwards(), *xrex_forwards(), *ranker_forwards())])
def test_no_host_tensor_enters_a_forward(name, forward):
    assert host_tensors_entering(forward) == [], name


def test_the_host_tensor_watch_sees_a_host_to_device_copy():
    table = torch.arange(4.0)
    assert host_tensors_entering(lambda: torch.ones(4, device=META) * table.to(META)) != []
    assert host_tensors_entering(lambda: torch.ones(4, device=META) * 2.0) == []
