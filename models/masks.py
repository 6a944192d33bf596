"""Attention masks, each written once as a predicate, with the structure every consumer reads.

A mask is a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` — the signature FlexAttention's
``mask_mod`` takes (attention-gym style). The same predicate produces the dense tensor the
model multiplies in (``dense``), the FlexAttention block mask (models.attention) and the
pictures the explorer draws. True = the query may attend to the key.

Each kind also states its structure once (``MaskKind``): how long the prefix is, whether the
prefix is causal, whether the positions after it are candidates that see only the prefix and
themselves. The decomposition and the flash kernels (models.attention), useful-FLOP counts
(benchmarks) and tile maps (``AttentionMask.tiles``) read that, never the kind's name; a test
proves the structure and the predicate describe the same mask. Adding a kind is one predicate
and one ``MASK_KINDS`` entry.

grok.py's ``make_recsys_attn_mask`` is kept with its own name and signature; a test proves it
equals the predicate.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

PREFIX_MODES = ("causal", "bidirectional")


# --- predicates -------------------------------------------------------------------------

def causal_mask() -> MaskMod:
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx
    return causal


def full_mask() -> MaskMod:
    def full(b, h, q_idx, kv_idx):
        return kv_idx >= 0  # always true, written as a tensor op so it broadcasts and traces
    return full


def recsys_mask(candidate_start_offset: int, prefix: str = "causal") -> MaskMod:
    """Candidates see the prefix (user + history) and themselves, never each other.

    prefix="causal" is grok.py's ``make_recsys_attn_mask``; "bidirectional" is production
    phoenix, where user and history attend to each other freely.
    """
    off = int(candidate_start_offset)
    if prefix == "causal":
        def recsys_causal(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & ((kv_idx < off) | (kv_idx == q_idx))
        return recsys_causal
    if prefix == "bidirectional":
        def recsys_bidirectional(b, h, q_idx, kv_idx):
            # a prefix query (q < off) sees the whole prefix; a candidate sees prefix + itself
            return (kv_idx < off) | (kv_idx == q_idx)
        return recsys_bidirectional
    raise ValueError(f"prefix: got {prefix!r}; allowed: {', '.join(PREFIX_MODES)}")


def padding_mask(valid: torch.Tensor) -> MaskMod:
    """Keys at padded slots are hidden (grok.py: ``mask[:, None, None, :]``). valid: [B, T] bool."""
    def padding(b, h, q_idx, kv_idx):
        return valid[b, kv_idx]
    return padding


def and_masks(*mods: MaskMod) -> MaskMod:
    def combined(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out
    return combined


# --- the registry: one predicate and its structure per kind -------------------------------

@dataclass(frozen=True)
class MaskKind:
    """One mask kind. Positions [0, P) are the prefix, attending within itself causally or not;
    with candidates, P = candidate_start_offset and every later position sees the prefix and
    itself only (the candidate x candidate block is empty but its diagonal). Without, P = T."""
    predicate: Callable[[int], MaskMod]     # candidate_start_offset -> mask_mod
    prefix_causal: bool
    has_candidates: bool
    prefix_mode: Optional[str] = None       # the model's own mask for TransformerConfig.prefix


MASK_KINDS: dict[str, MaskKind] = {
    "recsys": MaskKind(lambda off: recsys_mask(off, "causal"), prefix_causal=True, has_candidates=True,
                       prefix_mode="causal"),
    "recsys-bidirectional": MaskKind(lambda off: recsys_mask(off, "bidirectional"), prefix_causal=False,
                                     has_candidates=True, prefix_mode="bidirectional"),
    "causal": MaskKind(lambda off: causal_mask(), prefix_causal=True, has_candidates=False),
    "full": MaskKind(lambda off: full_mask(), prefix_causal=False, has_candidates=False),
}


def model_mask_kind(prefix: str) -> str:
    """The ranker's own mask for a prefix mode (TransformerConfig.prefix): the one place the
    prefix <-> kind mapping lives."""
    for name, kind in MASK_KINDS.items():
        if kind.prefix_mode == prefix:
            return name
    raise ValueError(f"prefix: got {prefix!r}; allowed: {', '.join(PREFIX_MODES)}")


def dense(mask_mod: MaskMod, q_len: int, kv_len: Optional[int] = None, batch: int = 1,
          device=None, q_start: int = 0) -> torch.Tensor:
    """Evaluate a predicate on the grid by broadcasting: [batch, 1, q_len, kv_len] bool for queries
    q_start .. q_start + q_len - 1, built on `device` (the device of any tensor the predicate reads, such
    as padding's `valid`)."""
    kv_len = q_len if kv_len is None else kv_len
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(q_start, q_start + q_len, device=device)[None, None, :, None]
    kv = torch.arange(kv_len, device=device)[None, None, None, :]
    out = mask_mod(b, h, q, kv)
    return out.expand(batch, 1, q_len, kv_len).bool()


SHARED_DENSE_MAX = 1 << 24      # T^2 up to this (T <= 4096, 16 MiB of bool) is kept across masks


@functools.lru_cache(maxsize=16)
def _shared_structure_dense(kind: str, seq_len: int, offset: Optional[int], device: str) -> torch.Tensor:
    return dense(MASK_KINDS[kind].predicate(offset), seq_len, device=device)


def _structure_dense(kind: str, seq_len: int, offset: Optional[int], device: str) -> torch.Tensor:
    """[1, 1, T, T] bool for one layout on one device: shared by every mask of that layout up to
    SHARED_DENSE_MAX; a longer one (a GiB at T = 32768) lives only as long as the mask that built it."""
    if seq_len * seq_len <= SHARED_DENSE_MAX:
        return _shared_structure_dense(kind, seq_len, offset, device)
    return dense(MASK_KINDS[kind].predicate(offset), seq_len, device=device)


# --- tiles: which blocks of the grid a block-sparse kernel computes ------------------------

EMPTY, PARTIAL, FULL = 0, 1, 2
TILE_CLASSES = {EMPTY: "empty (skipped)", PARTIAL: "partial (masked element by element)",
                FULL: "full (no mask needed)"}


@dataclass(frozen=True, eq=False)
class TileMap:
    """The mask cut into block_q x block_kv tiles (edge tiles hold only in-range pairs).

    allowed: [B|1, nq, nk] allowed pairs per tile; size: [nq, nk] in-range pairs per tile;
    classes: [B|1, nq, nk] EMPTY / PARTIAL / FULL. Built on the mask's device with no host read."""
    block_q: int
    block_kv: int
    allowed: torch.Tensor
    size: torch.Tensor
    classes: torch.Tensor

    def counts(self, row: int = 0) -> dict:
        """Tiles of each class in one batch row (a host read: for views and reports, not forwards)."""
        c = self.classes[min(row, self.classes.shape[0] - 1)]
        return {name: int((c == k).sum()) for k, name in ((EMPTY, "empty"), (PARTIAL, "partial"), (FULL, "full"))}

    def block_sparse(self):
        """FlashAttention-4's block-sparse form, per query tile: the kv tiles to run unmasked (full)
        and with mask_mod (partial), each list in ascending kv order, padded past its count.
        -> (full_cnt, full_idx, partial_cnt, partial_idx): [B|1, 1, nq] and [B|1, 1, nq, nk] int32."""
        def listing(cls):
            hit = self.classes == cls                                            # [B, nq, nk]
            order = torch.argsort((~hit).to(torch.int8), dim=-1, stable=True)    # hits first, in kv order
            return hit.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]
        return (*listing(FULL), *listing(PARTIAL))


def tile_map(mask_mod: MaskMod, seq_len: int, block_q: int, block_kv: int, batch: int = 1, device=None,
             max_elements: int = 1 << 24) -> TileMap:
    """Classify every tile by evaluating the predicate over rows of tiles at a time (never the whole
    T x T grid at once: at T = 32768 that would be a GiB)."""
    for name, v in (("block_q", block_q), ("block_kv", block_kv)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: got {v!r}; allowed: a positive integer")
    nq, nk = -(-seq_len // block_q), -(-seq_len // block_kv)
    kv = torch.arange(nk * block_kv, device=device)
    in_kv = kv < seq_len
    kv_clamped = kv.clamp_max(seq_len - 1)            # padding reads valid[b, kv]: stay in range
    rows_per_chunk = max(1, max_elements // (batch * block_q * nk * block_kv))
    parts = []
    for r0 in range(0, nq, rows_per_chunk):
        r1 = min(nq, r0 + rows_per_chunk)
        q = torch.arange(r0 * block_q, r1 * block_q, device=device)
        ok = mask_mod(torch.arange(batch, device=device)[:, None, None], torch.zeros((), dtype=torch.long,
                      device=device), q[None, :, None], kv_clamped[None, None, :])
        ok = ok & in_kv[None, None, :] & (q < seq_len)[None, :, None]
        ok = ok.expand(batch, -1, -1).reshape(batch, r1 - r0, block_q, nk, block_kv)
        parts.append(ok.sum((2, 4)))
    allowed = torch.cat(parts, 1)                                                # [B, nq, nk]
    rows = (seq_len - torch.arange(nq, device=device) * block_q).clamp(max=block_q)
    cols = (seq_len - torch.arange(nk, device=device) * block_kv).clamp(max=block_kv)
    size = rows[:, None] * cols[None, :]                                         # [nq, nk]
    classes = torch.where(allowed == 0, EMPTY, torch.where(allowed == size, FULL, PARTIAL)).to(torch.int8)
    return TileMap(block_q, block_kv, allowed, size, classes)


# --- the description backends receive --------------------------------------------------

def key_padding(valid: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A forward's [B, T] bool key padding, or None when no slot is padded (the unpadded fast paths).
    A mask on the host is read there, which costs no device sync, and dropped when all valid; a mask
    already on a device is kept unread (exact either way, and no sync); None means nothing is padded."""
    if valid is None:
        return None
    valid = valid.bool()
    if valid.device.type == "cpu" and bool(valid.all()):
        return None
    return valid


@dataclass(frozen=True, eq=False)
class AttentionMask:
    """Everything a backend may need to know about the mask, from which it builds its own form.

    kind: a key of MASK_KINDS; candidate_start_offset: where candidates begin (kinds with
    candidates); valid: optional [B, T] bool key-padding — None means no padding, and whether a
    mask is padded is read from that, never from the tensor's values (no host sync in a forward);
    seq_len: T. Derived forms (dense tensors, block masks, tile maps) are built once per device
    and kept on the mask, so a forward builds them in its first layer and a benchmark in warm-up."""
    kind: str
    seq_len: int
    candidate_start_offset: Optional[int] = None
    valid: Optional[torch.Tensor] = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask kind: got {self.kind!r}; allowed: {', '.join(MASK_KINDS)}")
        if self.has_candidates:
            off = self.candidate_start_offset
            if off is None or not 0 <= off <= self.seq_len:
                raise ValueError(
                    f"candidate_start_offset: got {off!r}; allowed: an integer in [0, {self.seq_len}] "
                    f"(the sequence length)")
        if self.valid is not None and (self.valid.dim() != 2 or self.valid.shape[1] != self.seq_len):
            raise ValueError(f"mask: got shape {tuple(self.valid.shape)}; allowed: [B, {self.seq_len}] "
                             f"(batch, sequence length)")

    # --- structure, from the registry --------------------------------------------------
    @property
    def structure(self) -> MaskKind:
        return MASK_KINDS[self.kind]

    @property
    def has_candidates(self) -> bool:
        return self.structure.has_candidates

    @property
    def prefix_causal(self) -> bool:
        return self.structure.prefix_causal

    @property
    def prefix(self) -> str:
        return "causal" if self.prefix_causal else "bidirectional"

    @property
    def prefix_len(self) -> int:
        """P: positions [0, P) attend within the prefix; [P, T) are candidates (prefix + self)."""
        return self.candidate_start_offset if self.has_candidates else self.seq_len

    @property
    def padded(self) -> bool:
        return self.valid is not None

    def useful_pairs(self) -> int:
        """(query, key) pairs the structure allows, per batch row and head (padding not counted)."""
        P, C = self.prefix_len, self.seq_len - self.prefix_len
        return (P * (P + 1) // 2 if self.prefix_causal else P * P) + C * (P + 1)

    # --- derived forms, cached per device -------------------------------------------------
    def cached(self, key, build: Callable[[], object]):
        """build() once per key for this mask (keys name the form and its device)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def structure_mod(self) -> MaskMod:
        return self.structure.predicate(self.candidate_start_offset)

    def mask_mod(self, device=None) -> MaskMod:
        """The predicate with padding; `device`: where the padding tensor it reads should live."""
        s = self.structure_mod()
        if self.valid is None:
            return s
        return and_masks(s, padding_mask(self.valid_on(device)))

    def valid_on(self, device=None) -> Optional[torch.Tensor]:
        if self.valid is None or device is None:
            return self.valid
        return self.cached(("valid", str(torch.device(device))), lambda: self.valid.to(device))

    def _device(self, device):
        if device is not None:
            return torch.device(device)
        return self.valid.device if self.valid is not None else torch.device("cpu")

    def dense(self, device=None) -> torch.Tensor:
        """[B or 1, 1, T, T] bool on `device` (default: valid's, else CPU) — what grok.py multiplies."""
        dev = self._device(device)

        def build():
            s = _structure_dense(self.kind, self.seq_len, self.candidate_start_offset, str(dev))
            return s if self.valid is None else s & self.valid_on(dev)[:, None, None, :]
        return self.cached(("dense", str(dev)), build)

    def dense_rows(self, start: int, stop: int, device=None) -> torch.Tensor:
        """[B or 1, 1, stop - start, T] bool: query rows start .. stop - 1 of dense(), built afresh (not
        kept), so a reference computed in pieces never holds the whole [T, T] mask."""
        dev = self._device(device)
        batch = 1 if self.valid is None else self.valid.shape[0]
        return dense(self.mask_mod(dev), stop - start, self.seq_len, batch, dev, q_start=start)

    def tiles(self, block_q: int, block_kv: int, device=None) -> TileMap:
        """The tile classification (empty / partial / full) that tile counts in the views and the
        FlashAttention-4 block-sparse tensors both read."""
        dev = self._device(device)
        batch = 1 if self.valid is None else self.valid.shape[0]
        return self.cached(("tiles", block_q, block_kv, str(dev)),
                           lambda: tile_map(self.mask_mod(dev), self.seq_len, block_q, block_kv, batch, dev))


# --- production's kernels: the tiles each one runs -----------------------------------------

def ranker_bounds(mask: AttentionMask) -> tuple[int, int, int, int]:
    """recsys_attention.py's ``bound = (0, P+L, P+L, T)``: (history start, history end, candidate start,
    candidate end). Production's ranker kernels read nothing else: every query sees keys in
    [0, P+L) and, past P+L, itself — ``recsys-bidirectional``'s predicate."""
    off = mask.prefix_len
    return 0, off, off, mask.seq_len


@dataclass(frozen=True)
class KernelTiling:
    """How one production attention kernel cuts the T x T grid (docs/originals.md §7), and which tiles it
    runs: full (no mask), partial (an element mask, or the diagonal) or skipped.

    The tiles come from ``tile_map`` over the mask's own predicate — the same classification the
    ``fa4`` backend turns into its block-sparse tensors — except where a kernel is known to ignore
    the mask: ``history_unmasked`` (serving) runs every key block that starts before P+L with no mask
    at all, and ``masks_padding`` False means padded keys are computed like any other."""
    title: str                          # short: a panel title
    source: str                         # where it lives and what it does
    block_q: int
    block_kv: int
    history_unmasked: bool = False
    masks_padding: bool = False

    def kernel_mask(self, mask: AttentionMask) -> AttentionMask:
        """The mask the kernel itself evaluates: the layout's, less the padding if it ignores padding."""
        if self.masks_padding or mask.valid is None:
            return mask
        return AttentionMask(mask.kind, mask.seq_len, mask.candidate_start_offset)

    def tiles(self, mask: AttentionMask, device=None, *, block_q: Optional[int] = None,
              block_kv: Optional[int] = None) -> TileMap:
        bq, bk = block_q or self.block_q, block_kv or self.block_kv
        t = self.kernel_mask(mask).tiles(bq, bk, device)
        if not (self.history_unmasked and mask.has_candidates):
            return t
        _, history_end, _, _ = ranker_bounds(mask)
        history_cols = torch.arange(t.classes.shape[-1], device=t.classes.device) * bk < history_end   # [nk]
        return TileMap(bq, bk, t.allowed, t.size, torch.where(history_cols, FULL, t.classes).to(torch.int8))

    def computed(self, mask: AttentionMask, tiles: Optional[TileMap] = None) -> torch.Tensor:
        """[B|1, T, T] bool: the pairs the kernel adds into a softmax — every pair of a full tile, the
        pairs its own mask allows in a partial tile, nothing in a skipped one."""
        t = tiles if tiles is not None else self.tiles(mask)
        T = mask.seq_len
        cls = t.classes.repeat_interleave(t.block_q, 1).repeat_interleave(t.block_kv, 2)[:, :T, :T]
        own = self.kernel_mask(mask).dense(cls.device)[:, 0]
        return (cls == FULL) | ((cls == PARTIAL) & own)


def kernel_work(kernel: KernelTiling, mask: AttentionMask, row: int = 0, tiles: Optional[TileMap] = None) -> dict:
    """What a kernel computes for one batch row of `mask`: tiles run / skipped, the share of the T x T
    work it skips (in tiles and in elements), and ``leaked`` — pairs it computes that the mask hides
    (unmasked history blocks past P+L, padded keys). `tiles`: kernel.tiles(mask), if already built."""
    t = tiles if tiles is not None else kernel.tiles(mask)
    r = min(row, t.classes.shape[0] - 1)
    run = t.classes[r] != EMPTY
    computed = kernel.computed(mask, t)
    hidden = ~mask.dense(computed.device)[:, 0]
    leaked = computed[min(row, computed.shape[0] - 1)] & hidden[min(row, hidden.shape[0] - 1)]
    return dict(**t.counts(r), tiles=int(run.numel()), run=int(run.sum()),
                skip_tiles=1 - int(run.sum()) / run.numel(),
                skip_elements=1 - int(t.size[run].sum()) / mask.seq_len ** 2, leaked=int(leaked.sum()))


KERNEL_TILINGS: dict[str, KernelTiling] = {
    "h100-train": KernelTiling(
        "H100 training · 64×64",
        "recsys_attention.py PallasRankerAttention: bound (0, P+L, P+L, T), history blocks then the "
        "candidate blocks over each program's own rows, element-masked", 64, 64),
    "h100-serve": KernelTiling(
        "H100 serving · 64×128",
        "recsys_attention.py PallasRankerAttentionInference: history key blocks of 128 run UNMASKED, "
        "candidate blocks diagonal-masked (exact only when P+L is a multiple of 128)", 64, 128,
        history_unmasked=True),
    "fa4": KernelTiling(
        "FA4 block-sparse · 128×128",
        "cutedsl/ranker_attention_fa4.py: history tiles full, each candidate tile's diagonal masked, "
        "the rest skipped; the fa4 backend here also masks padded keys (partial tiles)", 128, 128,
        masks_padding=True),
}


# --- grok.py's own function ------------------------------------------------------------

def make_recsys_attn_mask(seq_len: int, candidate_start_offset: int, dtype=torch.float32) -> torch.Tensor:
    """grok.py's name and signature: [1, 1, T, T], 1 = may attend."""
    if not 0 <= candidate_start_offset <= seq_len:
        raise ValueError(f"candidate_start_offset: got {candidate_start_offset}; allowed: [0, {seq_len}]")
    return dense(recsys_mask(candidate_start_offset, "causal"), seq_len).to(dtype)
