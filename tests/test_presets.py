"""models.presets: one table of geometries and layouts, and every consumer reading the same numbers from it —
the models' configs, the app's settings and links, the benchmark's grids."""
import math
from dataclasses import asdict

import pytest

from explorer.families import preset_settings
from explorer.measure import GRIDS, grid_for
from explorer.query_string import parse_query, to_query
from models.presets import PRESETS


def real_candidates(layout) -> int:
    return layout.num_candidates - layout.candidate_padding


def test_ranking_presets_read_one_history_and_candidate_count():
    """docs/originals.md §3: 1022 history events and 64 candidates in both families; grok.py puts one
    user token before them (T = 1087), production two prefix tokens, padded with empty candidate slots to
    T = 1152, a multiple of its kernels' 128-row tiles."""
    for name in ("phoenix-nano", "phoenix-prod"):
        lay = PRESETS[name].layout
        assert (lay.num_user, lay.num_history, real_candidates(lay), lay.seq_len) == (1, 1022, 64, 1087)
    for name in ("phoenix-2026", "phoenix-2026-nano", "phoenix-2026-seqpack"):
        lay = PRESETS[name].layout
        assert (lay.num_user, lay.num_history, real_candidates(lay), lay.seq_len) == (2, 1022, 64, 1152)


@pytest.mark.parametrize("name", list(PRESETS))
def test_both_trunks_are_built_at_the_tables_geometry_and_layout(name):
    p = PRESETS[name]
    for config in (p.transformer, p.xrex_config()):
        assert {f: getattr(config, f) for f in asdict(p.geometry)} == asdict(p.geometry)
    assert p.transformer.attn_output_multiplier == pytest.approx(1 / math.sqrt(p.geometry.key_size))
    c = p.xrex_config()
    assert (c.num_user_prefix_tokens, c.history_seq_len) == (p.layout.num_user, p.layout.num_history)


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_app_opens_each_preset_at_the_tables_geometry_and_layout(name):
    s = parse_query(f"preset={name}", need_model=False)
    assert (s.family, s.layout) == (PRESETS[name].family, PRESETS[name].layout)
    assert {f: getattr(s, f) for f in asdict(PRESETS[name].geometry)} == asdict(PRESETS[name].geometry)
    assert to_query(s) == f"preset={name}"
    # what the mask's kernel notes and the timing tab read of a preset, without the validation layer above them
    made = preset_settings(name)
    assert made == s and [type(v) for v in made.to_dict().values()] == [type(v) for v in s.to_dict().values()]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", list(GRIDS))
def test_benchmark_grids_time_their_presets_attention(name, device):
    """A grid times its preset's heads, head dim and candidate slots; one named after its preset times that
    preset's own sequence (on a CPU too, where batch and dtype are reduced)."""
    grid = grid_for(name, device)
    p = PRESETS[grid.model_preset]
    assert (grid.Hq, grid.Hkv, grid.head_dim) == (p.geometry.num_q_heads, p.geometry.num_kv_heads, p.geometry.key_size)
    assert grid.num_candidates == p.layout.num_candidates          # T - candidates: where candidates start
    if name in PRESETS:
        assert grid.model_preset == name
        assert p.layout.seq_len in grid.seq_lens
