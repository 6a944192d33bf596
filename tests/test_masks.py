"""Each mask predicate equals a dense matrix built independently, the way grok.py (or the
production description) builds it."""
import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.masks import MASK_KINDS, AttentionMask, dense, make_recsys_attn_mask

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
    np.testing.assert_array_equal(got.numpy(), grok_make_recsys_attn_mask(T, offset))


@pytest.mark.parametrize("offset", [0, 1, 4, T])
@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_predicate_equals_independent_dense(kind, offset):
    got = dense(MASK_KINDS[kind](offset), T)
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
