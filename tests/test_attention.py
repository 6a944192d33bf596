"""Every attention backend computes grok.py's attention: compared with `naive` (grok.py line for line).

Error is relative: max |backend - naive| / max |naive| over valid query positions (outputs at padded
positions mean nothing, FACTS.md §1). fp32 on CPU <= 1e-5; bf16/fp16 on CUDA <= 2e-2.
"""
import pytest
import torch

from models import attention as A
from models.attention import BACKENDS, attend, capability_table, unavailable_reason
from models.grok import Transformer, init_params
from models.masks import MASK_KINDS, AttentionMask
from models.recsys import get_preset

CPU_TOL, GPU_TOL = 1e-5, 2e-2
CAPS = [(30.0, "tanh"), (2.0, "tanh"), (3.0, "soft_sign"), (0.0, "none")]
CHEAP = ["sdpa", "sdpa-flash", "structured"]    # CPU backends with no compile step


def qkv(B=2, T=11, Hq=4, Hkv=2, K=8, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, K, generator=g) * 2     # * 2: logits reach the cap's bend
    k = torch.randn(B, T, Hkv, K, generator=g) * 2
    v = torch.randn(B, T, Hkv, K, generator=g)
    return (x.to(device=device, dtype=dtype) for x in (q, k, v))


def padded_valid(B, T, offset):
    """History padding in row 0 (slots just before the candidates), candidate padding in row 1."""
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, offset - 2:offset] = False
    valid[1, T - 1] = False
    return valid


def rel_err(out, ref, valid=None):
    keep = torch.ones(out.shape[:2], dtype=torch.bool) if valid is None else valid
    keep = keep.to(out.device)
    return ((out.float() - ref.float())[keep].abs().max() / ref.float()[keep].abs().max()).item()


def compare(backend, kind, cap, method, Hkv=2, padding=True, multiplier=0.5, T=11, offset=7):
    q, k, v = qkv(T=T, Hkv=Hkv)
    valid = padded_valid(q.shape[0], T, offset) if padding else None
    mask = AttentionMask(kind, T, offset, valid)
    kw = dict(multiplier=multiplier, cap=cap, cap_method=method)
    ref = attend(q, k, v, mask, **kw).out
    out = attend(q, k, v, mask, backend=backend, **kw).out
    return rel_err(out, ref, valid)


@pytest.mark.parametrize("backend", CHEAP)
@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("Hkv", [4, 2, 1])
@pytest.mark.parametrize("padding", [False, True])
def test_backend_matches_naive(backend, kind, Hkv, padding):
    ran = 0
    for cap, method in CAPS:
        if unavailable_reason(backend, cap=cap, cap_method=method, mask_kind=kind, padding=padding):
            continue
        assert compare(backend, kind, cap, method, Hkv=Hkv, padding=padding) <= CPU_TOL, (cap, method)
        ran += 1
    assert ran >= 1


@pytest.mark.parametrize("offset", [0, 1, 11])
def test_structured_edge_offsets(offset):
    """No prefix (every candidate sees only itself), a lone user token, no candidates."""
    for cap, method in CAPS[:2]:
        assert compare("structured", "recsys", cap, method, offset=offset, padding=False) <= CPU_TOL


def test_structured_never_builds_candidate_block(monkeypatch):
    """The decomposition's pieces never get candidate keys: only prefix keys reach any piece."""
    T, offset = 11, 7
    seen = []

    def spy(q, k, v, **kw):
        seen.append(k.shape[1])
        return A.math_piece(q, k, v, **kw)
    q, k, v = qkv(T=T)
    A.decomposed_attention(q, k, v, AttentionMask("recsys", T, offset), spy, multiplier=1.0, cap=30.0,
                           cap_method="tanh")
    assert seen == [offset, offset]


# --- flash_attn: the decomposition checked against an independent reference kernel --------

def reference_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, softcap=0.0,
                              return_attn_probs=False, **_):
    """flash_attn_func's documented contract in plain torch: q [B, Tq, H, D], k/v [B, S, Hkv, D],
    KV head of query head h is h // (H / Hkv), tanh softcap after scaling, lse [B, H, Tq]."""
    G = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(G, dim=2).float() for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * softmax_scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv).to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("cap,method", [(30.0, "tanh"), (1.5, "tanh"), (0.0, "none")])
@pytest.mark.parametrize("padding", [False, True])
def test_flash_attn_decomposition_with_reference_kernel(monkeypatch, kind, cap, method, padding):
    monkeypatch.setattr(A, "_flash_attn_func", lambda: reference_flash_attn_func)
    q, k, v = qkv(B=3, T=13, Hq=6, Hkv=2)
    valid = None
    if padding:
        valid = torch.ones(3, 13, dtype=torch.bool)
        valid[0, 7:9] = False          # history padding
        valid[1, 11:] = False          # candidate padding
        valid[2, 0] = False            # a padded first slot
    mask = AttentionMask(kind, 13, 9, valid)
    kw = dict(multiplier=0.3, cap=cap, cap_method=method)
    out = A.flash_attn_attention(q, k, v, mask, **kw).out
    assert rel_err(out, A.naive_attention(q, k, v, mask, **kw).out, valid) <= CPU_TOL


# --- FlexAttention: compiled per layout (~5-20 s each on CPU), so few shapes ---------------

@pytest.mark.slow
@pytest.mark.parametrize("kind,cap,method,Hkv,padding", [
    ("recsys", 30.0, "tanh", 2, True),
    ("recsys-bidirectional", 3.0, "soft_sign", 1, True),
    ("causal", 0.0, "none", 4, False),
])
def test_flex_matches_naive(kind, cap, method, Hkv, padding):
    assert compare("flex", kind, cap, method, Hkv=Hkv, padding=padding) <= CPU_TOL


@pytest.mark.slow
def test_flex_block_mask_cached_per_layout():
    mask = AttentionMask("recsys", 11, 7, padded_valid(2, 11, 7))
    same = AttentionMask("recsys", 11, 7, padded_valid(2, 11, 7))
    other = AttentionMask("recsys", 11, 6, padded_valid(2, 11, 7))
    assert A.flex_block_mask(mask, "cpu") is A.flex_block_mask(same, "cpu")
    assert A.flex_block_mask(mask, "cpu") is not A.flex_block_mask(other, "cpu")


# --- the whole model ------------------------------------------------------------------------

def lecture_model(**changes):
    config = get_preset("lecture").transformer.replace(**changes)
    return init_params(Transformer(config), "random", seed=1)


def model_inputs(T=9, offset=6, B=2, D=64):
    emb = torch.randn(B, T, D, generator=torch.Generator().manual_seed(3))
    return emb, padded_valid(B, T, offset), offset


@pytest.mark.parametrize("backend,prefix,cap_method", [
    ("structured", "causal", "tanh"), ("structured", "bidirectional", "soft_sign"),
    ("sdpa", "causal", "none"), ("sdpa-flash", "bidirectional", "none"),
    pytest.param("flex", "causal", "tanh", marks=pytest.mark.slow),
])
def test_whole_model_matches_naive(backend, prefix, cap_method):
    model = lecture_model(prefix=prefix, cap_method=cap_method, logit_cap=2.0)
    emb, valid, offset = model_inputs()
    with torch.no_grad():                                     # flex on CPU is inference-only
        ref = model(emb, valid, offset).embeddings
        out = model(emb, valid, offset, backend=backend).embeddings
    assert rel_err(out, ref, valid) <= CPU_TOL


@pytest.mark.parametrize("backend", ["structured", "sdpa-flash"])
def test_ranking_model_scores_match_naive_with_padding(backend):
    """The full ranker (embeddings -> trunk -> unembedding) on a padded synthetic batch."""
    from models.recsys import RecsysModel, SequenceLayout, init_recsys, synthetic_batch
    preset = get_preset("lecture")
    config = preset.recsys_config(preset.transformer.replace(cap_method="none", prefix="bidirectional"))
    model = init_recsys(RecsysModel(config), "random", seed=2)
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    batch = synthetic_batch(config, layout, seed=5, batch=2)
    with torch.no_grad():
        ref, out = model(batch), model(batch, backend=backend)
    real = ~torch.tensor([s == "P" for s in layout.segments()[layout.candidate_start_offset:]])
    assert rel_err(out.logits[:, real], ref.logits[:, real]) <= CPU_TOL


def test_whole_model_refuses_inexact_backend():
    model = lecture_model()                                   # grok.py's tanh cap 30
    emb, valid, offset = model_inputs()
    with pytest.raises(ValueError, match="SDPA has no logit cap"):
        model(emb, valid, offset, backend="sdpa")


# --- the capability table: refusals carry their reason, nothing is approximated -------------

def test_refusals_say_why():
    assert "SDPA has no logit cap" in unavailable_reason("sdpa", cap=30.0, cap_method="tanh")
    assert unavailable_reason("sdpa", cap=0.0, cap_method="tanh") is None        # cap <= 0 is off
    assert "needs CUDA" in unavailable_reason("flash_attn", device="cpu")
    assert "needs CUDA" in unavailable_reason("sdpa-efficient", device="cpu")
    assert "heatmaps need naive" in unavailable_reason("flex", need_weights=True)
    assert "unknown backend" in unavailable_reason("nope")
    if not torch.cuda.is_available():
        assert unavailable_reason("flash_attn", device="cuda", dtype="bfloat16") == "needs CUDA"


def test_flash_attn_refusals_on_cuda(monkeypatch):
    monkeypatch.setattr(A, "_needs_cuda_build", lambda: None)                  # pretend a GPU
    monkeypatch.setattr(A, "_flash_attn_func", lambda: reference_flash_attn_func)
    ok = dict(device="cuda", dtype="bfloat16", cap=30.0, cap_method="tanh", mask_kind="recsys")
    assert unavailable_reason("flash_attn", **ok) is None
    assert "soft_sign" in unavailable_reason("flash_attn", **{**ok, "cap_method": "soft_sign"})
    assert "float32" in unavailable_reason("flash_attn", **{**ok, "dtype": "float32"})
    assert unavailable_reason("flash_attn", **ok, padding=True) is None          # unpadded row by row
    assert "padding" in unavailable_reason("sdpa-cudnn", **{**ok, "cap": 0.0, "mask_kind": "causal"}, padding=True)
    assert "head dim" in unavailable_reason("flash_attn", **ok, head_dim=512)
    assert "recsys" in unavailable_reason("sdpa-flash", **{**ok, "cap": 0.0})    # CUDA flash SDPA: no mask
    monkeypatch.setattr(A, "_flash_attn_func", lambda: (_ for _ in ()).throw(ImportError()))
    assert unavailable_reason("flash_attn", **ok) == "flash-attn not installed"


def test_attend_raises_rather_than_approximates():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend: sdpa: SDPA has no logit cap"):
        attend(q, k, v, AttentionMask("causal", 11), cap=30.0, cap_method="tanh", backend="sdpa")


def test_capability_table_agrees_with_unavailable_reason():
    rows = capability_table()
    assert {r["backend"] for r in rows} == set(BACKENDS)
    for r in rows:
        if r["unavailable"]:
            continue
        base = dict(device=r["device"], dtype=r["dtypes"][0], cap=30.0, cap_method=r["cap_methods"][0],
                    mask_kind=r["mask_kinds"][0])
        assert unavailable_reason(r["backend"], **base) is None, r
        for method in set(A.CAP_METHODS) - set(r["cap_methods"]):
            assert unavailable_reason(r["backend"], **{**base, "cap_method": method}), (r, method)
        for kind in set(MASK_KINDS) - set(r["mask_kinds"]):
            assert unavailable_reason(r["backend"], **{**base, "mask_kind": kind}), (r, kind)
        assert (unavailable_reason(r["backend"], **base, padding=True) is None) == r["padding"]
        assert (unavailable_reason(r["backend"], **base, need_weights=True) is None) == r["returns_weights"]


# --- GPU: bf16 / fp16 against naive in fp32 on the same inputs -----------------------------

GPU_COMPILED = {"flex"}     # a Triton compile per case: checked on one case, not the grid


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["recsys", "recsys-bidirectional", "causal"])
@pytest.mark.parametrize("padding", [False, True])
def test_gpu_backends_match_naive(dtype, kind, padding):
    T, offset = 200, 136                          # 1 user + 135 history + 64 candidates
    q, k, v = qkv(B=2, T=T, Hq=20, Hkv=4, K=128, dtype=dtype, device="cuda")
    valid = padded_valid(2, T, offset) if padding else None
    mask = AttentionMask(kind, T, offset, valid)
    ran = []
    for backend in BACKENDS:
        for cap, method in [(30.0, "tanh"), (0.0, "none")]:
            if backend in GPU_COMPILED and (dtype, kind, padding, method) != (torch.bfloat16, "recsys", True, "tanh"):
                continue
            kw = dict(multiplier=128 ** -0.5, cap=cap, cap_method=method)
            if unavailable_reason(backend, device="cuda", dtype=str(dtype)[6:], mask_kind=kind, head_dim=128,
                                  cap=cap, cap_method=method, padding=padding):
                continue
            ref = A.naive_attention(q.float(), k.float(), v.float(), mask, **kw).out
            err = rel_err(attend(q, k, v, mask, backend=backend, **kw).out, ref, valid)
            assert err <= GPU_TOL, (backend, method, err)
            ran.append(backend)
    assert "naive" in ran and "structured" in ran
