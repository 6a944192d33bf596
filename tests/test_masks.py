"""Each mask predicate equals a dense matrix built independently, the way grok.py (or the
production description) builds it."""
import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.masks import (EMPTY, FULL, MASK_KINDS, PARTIAL, PREFIX_MODES, AttentionMask, dense,
                          make_recsys_attn_mask, model_mask_kind)
from tolerances import assert_bit_exact

T = 9

# kind -> independent dense builder (offset) -> [T, T] bool; a kind added to MASK_KINDS
# without an entry here fails test_every_kind_has_a_reference
REFERENCE = {
    "recsys": lambda off: ref.structure_mask(T, off, "causal"),
    "recsys-bidirectional": lambda off: ref.structure_mask(T, off, "bidirectional"),
    "causal": lambda off: np.tril(np.ones((T, T), bool)),
    "full": lambda off: np.ones((T, T), bool),
}


def grok_make_recsys_attn_mask(seq_len, offset):
    """grok.py's construction, step by step: tril, zero the candidate block, set its diagonal."""
    m = np.tril(np.ones((seq_len, seq_len), np.float32))
    m[offset:, offset:] = 0
    for i in range(offset, seq_len):
        m[i, i] = 1
    return m[None, None]


def test_every_kind_has_a_reference():
    assert set(MASK_KINDS) == set(REFERENCE)


@pytest.mark.parametrize("offset", range(T + 1))
def test_make_recsys_attn_mask_equals_grok_construction(offset):
    got = make_recsys_attn_mask(T, offset)
    assert got.shape == (1, 1, T, T) and got.dtype == torch.float32
    assert_bit_exact(got, grok_make_recsys_attn_mask(T, offset), "no rounding")     # 0s and 1s


@pytest.mark.parametrize("offset", [0, 1, 4, T])
@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_predicate_equals_independent_dense(kind, offset):
    got = dense(MASK_KINDS[kind].predicate(offset), T)
    assert got.shape == (1, 1, T, T)
    np.testing.assert_array_equal(got[0, 0].numpy(), REFERENCE[kind](offset))


@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_padding_hides_keys_only(kind):
    valid = torch.tensor([[True, True, False, True, True, True, True, True, False],
                          [True, False, True, True, True, True, True, False, True]])
    got = AttentionMask(kind, T, 5, valid).dense()                         # [B, 1, T, T]
    expected = REFERENCE[kind](5)[None] & valid.numpy()[:, None, :]        # keys masked, queries not
    np.testing.assert_array_equal(got[:, 0].numpy(), expected)


def test_candidates_never_see_each_other_and_prefix_is_causal():
    off = 4
    m = make_recsys_attn_mask(T, off)[0, 0].bool()
    cand = torch.arange(off, T)
    block = m[off:, off:]
    assert torch.equal(block, torch.eye(T - off, dtype=torch.bool))
    assert m[cand][:, :off].all()                       # every candidate sees the whole prefix
    assert torch.equal(m[:off, :off], torch.tril(torch.ones(off, off, dtype=torch.bool)))
    assert not m[:off, off:].any()                      # the prefix never sees candidates


def test_bad_mask_inputs():
    with pytest.raises(ValueError, match=r"mask kind: got 'diagonal'; allowed: recsys, .*full"):
        AttentionMask("diagonal", T, 3)
    for off in (-1, T + 1, None):
        with pytest.raises(ValueError, match=rf"candidate_start_offset: got {off}; allowed: .*\[0, {T}\]"):
            AttentionMask("recsys", T, off)
    with pytest.raises(ValueError, match=rf"mask: got shape \(2, {T - 1}\); allowed: \[B, {T}\]"):
        AttentionMask("causal", T, None, torch.ones(2, T - 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"candidate_start_offset: got 10; allowed: \[0, 9\]"):
        make_recsys_attn_mask(T, 10)


# --- structure: what the decomposition, FLOP counts and tile maps read instead of the kind's name ---

def structure_dense(m: AttentionMask) -> np.ndarray:
    """The mask rebuilt from the declared structure alone (prefix length, causal prefix, candidates)."""
    T, P = m.seq_len, m.prefix_len
    q, kv = np.arange(T)[:, None], np.arange(T)[None, :]
    prefix = (kv < P) & ((kv <= q) if m.prefix_causal else True)
    prefix = prefix & ((q < P) | (kv < P))                 # candidates see the whole prefix
    return prefix | ((q >= P) & (kv == q))


@pytest.mark.parametrize("offset", [0, 1, 4, T])
@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_structure_describes_the_predicate(kind, offset):
    m = AttentionMask(kind, T, offset)
    np.testing.assert_array_equal(m.dense()[0, 0].numpy(), structure_dense(m))
    assert m.useful_pairs() == int(m.dense().sum())


def test_prefix_mode_maps_to_the_models_kind():
    for prefix in PREFIX_MODES:
        m = AttentionMask(model_mask_kind(prefix), T, 4)
        assert m.has_candidates and m.prefix == prefix
    assert model_mask_kind("causal") == "recsys"          # grok.py's make_recsys_attn_mask
    with pytest.raises(ValueError, match=r"prefix: got 'sideways'; allowed: causal, bidirectional"):
        model_mask_kind("sideways")


def independent_tile_classes(allowed: np.ndarray, bq: int, bk: int) -> np.ndarray:
    T = allowed.shape[0]
    out = np.zeros((-(-T // bq), -(-T // bk)), np.int8)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            tile = allowed[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
            out[i, j] = EMPTY if not tile.any() else FULL if tile.all() else PARTIAL
    return out


@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("bq,bk", [(4, 4), (3, 5), (16, 8)])
def test_tile_map_matches_the_dense_mask(kind, bq, bk):
    Tl, off = 37, 25
    valid = torch.ones(2, Tl, dtype=torch.bool)
    valid[1, 20:23] = False
    m = AttentionMask(kind, Tl, off, valid)
    tiles = m.tiles(bq, bk)
    dense_b = m.dense()[:, 0].numpy()
    for b in range(2):
        expected = independent_tile_classes(dense_b[b], bq, bk)
        np.testing.assert_array_equal(tiles.classes[b].numpy(), expected)
        assert int(tiles.allowed[b].sum()) == int(dense_b[b].sum())
    full_cnt, full_idx, part_cnt, part_idx = tiles.block_sparse()
    for cnt, idx, cls in ((full_cnt, full_idx, FULL), (part_cnt, part_idx, PARTIAL)):
        assert cnt.dtype == idx.dtype == torch.int32 and cnt.shape[1] == idx.shape[1] == 1
        for b in range(2):
            for i in range(tiles.classes.shape[1]):
                want = np.flatnonzero(tiles.classes[b, i].numpy() == cls)
                assert int(cnt[b, 0, i]) == len(want)
                np.testing.assert_array_equal(idx[b, 0, i, :len(want)].numpy(), want)


def test_tile_map_in_row_chunks_equals_one_pass():
    from models.masks import tile_map
    m = AttentionMask("recsys-bidirectional", 300, 236)
    whole = tile_map(m.mask_mod(), 300, 64, 128)
    chunked = tile_map(m.mask_mod(), 300, 64, 128, max_elements=1)          # one row of tiles at a time
    assert torch.equal(whole.classes, chunked.classes) and torch.equal(whole.allowed, chunked.allowed)


def test_recsys_tiles_skip_the_candidate_block():
    """Production geometry: prefix 1024 (8 kv tiles of 128), 64 candidates -> the candidate tile row runs
    its 8 prefix tiles full and its diagonal tile partial; nothing else in the candidate block."""
    m = AttentionMask("recsys-bidirectional", 1088, 1024)
    c = m.tiles(128, 128).classes[0]
    assert (c[:8, :8] == FULL).all() and (c[:8, 8] == EMPTY).all()
    assert (c[8, :8] == FULL).all() and c[8, 8] == PARTIAL
    assert m.tiles(128, 128).counts() == {"empty": 8, "partial": 1, "full": 72}


def test_derived_forms_are_built_once_per_device():
    m = AttentionMask("recsys", T, 4, torch.ones(2, T, dtype=torch.bool))
    assert m.dense() is m.dense("cpu") and m.tiles(4, 4) is m.tiles(4, 4)
    assert m.dense("meta").device.type == "meta"             # built where asked, not moved there


def test_bad_tile_sizes():
    with pytest.raises(ValueError, match=r"block_q: got 0; allowed: a positive integer"):
        AttentionMask("causal", T).tiles(0, 4)


def test_long_dense_masks_are_not_kept_beyond_their_mask(monkeypatch):
    import models.masks as M
    monkeypatch.setattr(M, "SHARED_DENSE_MAX", 8 * 8)
    short, long_ = AttentionMask("causal", 8), AttentionMask("causal", 9)
    assert short.dense() is AttentionMask("causal", 8).dense()          # shared per layout
    assert long_.dense() is long_.dense()                               # kept on its own mask only
    assert long_.dense() is not AttentionMask("causal", 9).dense()


# --- production's kernels (KERNEL_TILINGS): the work each runs -----------------------------

def test_production_layout_kernel_counts():
    """T = 1152, P + L = 2 + 1022 = 1024 (docs/originals.md §7): FA4 runs 73 of its 81 128x128 tiles (72 history
    tiles full, the candidate diagonal masked, the candidate column of the history rows skipped); the
    H100 kernels run every history block and the candidate blocks over their own rows; P + L is a
    multiple of 128, so nothing runs that the mask hides."""
    from models.masks import KERNEL_TILINGS, kernel_work, ranker_bounds
    m = AttentionMask("recsys-bidirectional", 1152, 1024)
    assert ranker_bounds(m) == (0, 1024, 1024, 1152)
    fa4 = kernel_work(KERNEL_TILINGS["fa4"], m)
    assert (fa4["run"], fa4["tiles"], fa4["full"], fa4["partial"], fa4["empty"], fa4["leaked"]) == (73, 81, 72, 1, 8, 0)
    assert fa4["skip_tiles"] == pytest.approx(8 / 81)
    train = kernel_work(KERNEL_TILINGS["h100-train"], m)       # 18 x 18 tiles of 64: 16 history columns + 2 diagonals
    assert (train["run"], train["tiles"], train["leaked"]) == (18 * 16 + 2, 18 * 18, 0)
    serve = kernel_work(KERNEL_TILINGS["h100-serve"], m)       # 18 x 9 tiles of 64 x 128
    assert (serve["run"], serve["tiles"], serve["leaked"]) == (18 * 8 + 2, 18 * 9, 0)


@pytest.mark.parametrize("off,Tl", [(1024, 1152), (130, 140), (7, 200), (128, 129)])
def test_serving_tiles_compute_what_the_serving_kernel_adds(off, Tl):
    """The serving tiling's computed pairs equal the element-wise account of that kernel written
    independently for the bug zoo (history blocks of 128 unmasked, then each candidate's diagonal)."""
    from models.bugzoo import serving_kernel_counts
    from models.masks import KERNEL_TILINGS, kernel_work
    m = AttentionMask("recsys-bidirectional", Tl, off)
    computed = KERNEL_TILINGS["h100-serve"].computed(m)[0]
    assert torch.equal(computed, serving_kernel_counts(Tl, off, 128) > 0)
    leaked = kernel_work(KERNEL_TILINGS["h100-serve"], m)["leaked"]
    assert leaked == int((computed & ~m.dense()[0, 0]).sum())
    assert (leaked == 0) == (off % 128 == 0)          # exact only when P + L is a multiple of 128


def test_element_masked_kernels_compute_the_mask_and_ignore_padding():
    """The training kernel and FA4 compute exactly the mask's pairs; production's training kernel masks
    no padded key (each padded history slot leaks into every row), the fa4 backend here does."""
    from models.masks import KERNEL_TILINGS, kernel_work
    Tl, off = 300, 236
    valid = torch.ones(1, Tl, dtype=torch.bool)
    valid[0, 200:205] = False
    plain, padded = AttentionMask("recsys-bidirectional", Tl, off), AttentionMask("recsys-bidirectional", Tl, off, valid)
    for name in ("h100-train", "fa4"):
        assert torch.equal(KERNEL_TILINGS[name].computed(plain)[0], plain.dense()[0, 0])
    assert kernel_work(KERNEL_TILINGS["h100-train"], padded)["leaked"] == 5 * Tl
    assert kernel_work(KERNEL_TILINGS["fa4"], padded)["leaked"] == 0
    assert torch.equal(KERNEL_TILINGS["fa4"].tiles(padded).classes, padded.tiles(128, 128).classes)
