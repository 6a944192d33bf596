"""Weights from and to the original: haiku mappings round-trip losslessly, files round-trip,
and anything wrong is refused with every problem named and nothing loaded."""
import dataclasses
import json
import math
import zipfile

import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.grok import Transformer, TransformerConfig, init_params
from models.presets import get_preset
from models.recsys import (PhoenixRetrievalModel, RecsysConfig, RecsysModel, init_recsys,
                           synthetic_batch)
from models.weights import (config_from_weight_file, haiku_params, load_haiku_params, load_weights,
                            model_from_weight_file, read_weight_file, save_weights)
from tolerances import assert_bit_exact

CFG = TransformerConfig(emb_size=64, key_size=16, num_q_heads=4, num_kv_heads=2, num_layers=2,
                        attn_output_multiplier=1 / math.sqrt(16))


def random_params(cfg=CFG, seed=0):
    return ref.random_haiku_params(np.random.default_rng(seed), cfg.emb_size, cfg.key_size, cfg.num_q_heads,
                                   cfg.num_kv_heads, cfg.num_layers, ref.ffn_size(cfg.emb_size, 4.0))


def expected_paths(num_layers):
    """docs/originals.md §1, written out by hand."""
    paths = set()
    for i in range(num_layers):
        p = f"transformer/decoder_layer_{i}"
        paths |= {f"{p}/rms_norm", f"{p}/rms_norm_1", f"{p}/rms_norm_2", f"{p}/rms_norm_3",
                  f"{p}/multi_head_attention/query", f"{p}/multi_head_attention/key",
                  f"{p}/multi_head_attention/value", f"{p}/multi_head_attention/linear",
                  f"{p}/linear", f"{p}/linear_v", f"{p}/linear_1"}
    return paths


def assert_same_params(a, b):
    """The same modules, names and bits: loads and exports only copy (and widen exactly)."""
    assert a.keys() == b.keys()
    for m in a:
        assert a[m].keys() == b[m].keys(), m
        for n in a[m]:
            assert_bit_exact(a[m][n], b[m][n], "no rounding")


def test_export_has_grok_paths_and_shapes():
    params = haiku_params(init_params(Transformer(CFG), "random", 0))
    assert set(params) == expected_paths(2)
    layer = "transformer/decoder_layer_1"
    assert params[f"{layer}/multi_head_attention/query"]["w"].shape == (64, 4 * 16)
    assert params[f"{layer}/multi_head_attention/key"]["w"].shape == (64, 2 * 16)
    assert params[f"{layer}/multi_head_attention/linear"]["w"].shape == (4 * 16, 64)
    assert params[f"{layer}/linear_1"]["w"].shape == (176, 64)
    assert set(params[f"{layer}/rms_norm_3"]) == {"scale"}


def test_haiku_load_export_round_trip_is_lossless():
    params = random_params(seed=1)
    model = load_haiku_params(Transformer(CFG), params)
    assert_same_params(haiku_params(model), params)
    # and the parameters really landed where grok.py has them
    w = params["transformer/decoder_layer_1/linear_v"]["w"]
    assert_bit_exact(model.layers[1].dense_block.linear_v.w, w, "no rounding")


def test_load_accepts_jax_like_arrays():
    class JaxLike:   # anything exposing __array__, as jax.Array does
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a if dtype is None else self.a.astype(dtype)

    params = random_params(seed=2)
    wrapped = {m: {n: JaxLike(v) for n, v in inner.items()} for m, inner in params.items()}
    assert_same_params(haiku_params(load_haiku_params(Transformer(CFG), wrapped)), params)


def test_bad_params_list_every_problem_and_load_nothing():
    model = init_params(Transformer(CFG), "random", 0)
    before = haiku_params(model)
    bad = random_params(seed=3)
    bad["transformer/decoder_layer_0/multi_head_attention/query"] = {"w": np.zeros((64, 32), np.float32)}
    bad["transformer/decoder_layer_1/linear_1"] = {"w": np.zeros((64, 176), np.float32)}
    del bad["transformer/decoder_layer_1/rms_norm_2"]
    bad["transformer/decoder_layer_2/rms_norm"] = {"scale": np.ones(64, np.float32)}
    with pytest.raises(ValueError) as e:
        load_haiku_params(model, bad)
    msg = str(e.value)
    assert msg.startswith("weights:")
    assert ("transformer/decoder_layer_0/multi_head_attention/query/w has shape [64, 32], expected [64, 64]"
            in msg)
    assert "transformer/decoder_layer_1/linear_1/w has shape [64, 176], expected [176, 64]" in msg
    assert "transformer/decoder_layer_1/rms_norm_2/scale is missing" in msg
    assert "transformer/decoder_layer_2/rms_norm/scale is unexpected" in msg
    assert_same_params(haiku_params(model), before)     # nothing was loaded


def test_non_finite_and_non_mapping_params_refused():
    bad = random_params(seed=4)
    bad["transformer/decoder_layer_0/rms_norm"]["scale"][3] = np.nan
    with pytest.raises(ValueError, match="rms_norm/scale contains NaN"):
        load_haiku_params(Transformer(CFG), bad)
    with pytest.raises(ValueError, match="weights: got list"):
        load_haiku_params(Transformer(CFG), [1, 2])
    with pytest.raises(ValueError, match="model: got Linear; allowed: Transformer, RecsysModel or "
                                         "PhoenixRetrievalModel"):
        load_haiku_params(torch.nn.Linear(2, 2), random_params())


# --- files --------------------------------------------------------------------------------

def lecture_recsys(seed):
    preset = get_preset("lecture")
    return init_recsys(RecsysModel(preset.recsys_config()), "random", seed), preset


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_transformer_file_round_trip(tmp_path, ext):
    model = load_haiku_params(Transformer(CFG.replace(rope_mode="shared")), random_params(seed=5))
    path = tmp_path / f"trunk.{ext}"
    save_weights(model, path)
    flat = read_weight_file(path)
    assert {k.rpartition("/")[0] for k in flat} == expected_paths(2)
    assert config_from_weight_file(path) == model.config
    other = init_params(Transformer(CFG), "random", 9)
    assert_same_params(haiku_params(load_weights(other, path)), haiku_params(model))
    assert_same_params(haiku_params(model_from_weight_file(path)), haiku_params(model))


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_recsys_file_round_trip(tmp_path, ext):
    model, preset = lecture_recsys(0)
    path = tmp_path / f"ranker.{ext}"
    save_weights(model, path)
    keys = set(read_weight_file(path))
    assert "phoenix_model/unembeddings" in keys and "transformer/decoder_layer_0/linear_v/w" in keys
    assert "hash_tables/post_embeddings" in keys    # the app's files keep the project's own tables
    rebuilt = model_from_weight_file(path)
    assert isinstance(rebuilt, RecsysModel) and rebuilt.config == model.config
    for a, b in zip(model.parameters(), rebuilt.parameters()):
        assert_bit_exact(b, a, "no rounding")
    batch = synthetic_batch(model.config, preset.layout, seed=1)
    assert_bit_exact(rebuilt(batch).logits, model(batch).logits, "same computation")   # the same bits in
    # a ranker file is not a trunk file: the extra keys are named
    with pytest.raises(ValueError, match="(?s)weights file: 10 problem.*phoenix_model/action_projection is unexpected"):
        load_weights(Transformer(model.config.transformer), path)


def test_file_without_config_loads_into_a_given_model(tmp_path):
    params = random_params(seed=6)
    path = tmp_path / "from_jax.npz"
    np.savez(path, **{f"{m}/{n}": v for m, inner in params.items() for n, v in inner.items()})
    assert config_from_weight_file(path) is None
    with pytest.raises(ValueError, match="carries no config"):
        model_from_weight_file(path)
    assert_same_params(haiku_params(load_weights(Transformer(CFG), path)), params)


def test_bad_files_refused(tmp_path):
    model = init_params(Transformer(CFG), "random", 0)
    for name in ("w.pt", "w.pkl", "w.npy", "w"):
        with pytest.raises(ValueError, match=r"weights file: got .*; allowed: a \.npz or \.safetensors file"):
            save_weights(model, tmp_path / name)
        (tmp_path / name).write_bytes(b"x")
        with pytest.raises(ValueError, match=r"weights file: got .*; allowed: a \.npz or \.safetensors"):
            load_weights(model, tmp_path / name)
    with pytest.raises(ValueError, match="weights file: .* does not exist"):
        read_weight_file(tmp_path / "missing.npz")
    good = tmp_path / "w.safetensors"
    save_weights(model, good)
    with pytest.raises(ValueError, match=r"weights file: 'w.safetensors' is [\d,]+ bytes; allowed: at most 1,000"):
        read_weight_file(good, max_bytes=1000)
    for ext in ("npz", "safetensors"):
        corrupt = tmp_path / f"corrupt.{ext}"
        corrupt.write_bytes(b"not a weight file at all" * 10)
        with pytest.raises(ValueError, match=f"weights file: 'corrupt.{ext}' .*not .*{ext}"):
            read_weight_file(corrupt)


def test_pickle_in_npz_refused(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, **{"transformer/decoder_layer_0/rms_norm/scale": np.array([{"a": 1}], dtype=object)})
    model = init_params(Transformer(CFG), "random", 0)
    before = haiku_params(model)
    with pytest.raises(ValueError, match="weights file: 'evil.npz' contains pickled objects; refused"):
        load_weights(model, path)
    assert_same_params(haiku_params(model), before)


def test_npz_expanding_past_the_cap_refused(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, big=np.zeros(200_000, np.float32))    # 800 kB of zeros, a few kB on disk
    assert path.stat().st_size < 10_000
    with pytest.raises(ValueError, match="unpacks to"):
        read_weight_file(path, max_bytes=100_000)
    with zipfile.ZipFile(path) as z:
        assert z.infolist()[0].file_size > 100_000


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_float16_file_loads_rounded_into_fp32_model(tmp_path, ext):
    model = load_haiku_params(Transformer(CFG), random_params(seed=8))
    path = tmp_path / f"half.{ext}"
    save_weights(model, path, dtype="float16")
    assert all(a.dtype == np.float16 for a in read_weight_file(path).values())
    loaded = model_from_weight_file(path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for (name, a), b in zip(model.named_parameters(), loaded.parameters()):
        assert_bit_exact(b, a.detach().half().float(), "no rounding")          # the same fp16 values, widened
    with pytest.raises(ValueError, match="dtype: got 'int8'; allowed: float32, float16"):
        save_weights(model, path, dtype="int8")


# --- the original's own mappings: phoenix_model/..., phoenix_retrieval_model/... ------------------

LECTURE = get_preset("lecture").transformer


def original_params(model, seed=0, cfg=LECTURE):
    return ref.phoenix_init_params(np.random.default_rng(seed), model, emb_size=cfg.emb_size, key_size=cfg.key_size,
                                   num_q_heads=cfg.num_q_heads, num_kv_heads=cfg.num_kv_heads,
                                   num_layers=cfg.num_layers, ffn_hidden=cfg.ffn_hidden)


# written out by hand from the issue / docs/originals.md §2: what the original's init returns besides the trunk.
# Haiku names a submodule made in a method other than __call__ "parent/~method/child" (haiku module.py
# unique_and_canonical_name); the original makes its CandidateTower in build_candidate_representation.
TOWER = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"
ORIGINAL_OWN = {
    "phoenix_model": {("phoenix_model", "proj_mat_1"): (128, 64), ("phoenix_model", "proj_mat_2"): (320, 64),
                      ("phoenix_model", "proj_mat_3"): (384, 64), ("phoenix_model", "action_projection"): (19, 64),
                      ("phoenix_model", "product_surface_embedding_table"): (16, 64),
                      ("phoenix_model", "unembeddings"): (64, 19), ("phoenix_model/rms_norm", "scale"): (64,)},
    "phoenix_retrieval_model": {
        ("phoenix_retrieval_model", "proj_mat_1"): (128, 64), ("phoenix_retrieval_model", "proj_mat_3"): (384, 64),
        ("phoenix_retrieval_model", "action_projection"): (19, 64),
        ("phoenix_retrieval_model", "product_surface_embedding_table"): (16, 64),
        (TOWER, "candidate_tower_projection_1"): (256, 128), (TOWER, "candidate_tower_projection_2"): (128, 64)},
}


@pytest.mark.parametrize("kind", [RecsysModel, PhoenixRetrievalModel])
def test_original_init_mapping_loads_as_it_is_and_round_trips(kind):
    root = "phoenix_model" if kind is RecsysModel else "phoenix_retrieval_model"
    params = original_params(root, seed=1)
    own = {(m, n): v.shape for m, inner in params.items() if not m.startswith("transformer/")
           for n, v in inner.items()}
    assert own == ORIGINAL_OWN[root]                                   # the test's mapping is the original's
    model = load_haiku_params(kind(RecsysConfig(LECTURE)), params)    # no renaming, no hash tables
    assert_same_params(haiku_params(model, hash_tables=False), params)
    exported = haiku_params(model)
    assert set(exported) - set(params) == {"hash_tables"}
    # the parameters landed where the original uses them
    w = model.user_projection.w if kind is RecsysModel else model.candidate_tower.projection_2.w
    expected = params[root]["proj_mat_1"] if kind is RecsysModel else \
        params[TOWER]["candidate_tower_projection_2"]
    assert_bit_exact(w, expected, "no rounding")


def test_original_mapping_with_problems_refused_by_name_and_nothing_loaded():
    model = init_recsys(RecsysModel(RecsysConfig(LECTURE)), "random", 0)
    before = haiku_params(model)
    bad = original_params("phoenix_model", seed=2)
    bad["phoenix_model"]["proj_mat_2"] = bad["phoenix_model"]["proj_mat_2"][:-64]
    del bad["phoenix_model"]["unembeddings"]
    bad["phoenix_model"]["product_surface_embedding_table"] = np.zeros((8, 64), np.float32)
    bad[TOWER] = {"candidate_tower_projection_1": np.zeros((256, 128))}
    with pytest.raises(ValueError) as e:
        load_haiku_params(model, bad)
    msg = str(e.value)
    assert msg.startswith("weights: 4 problem(s)")
    assert "phoenix_model/proj_mat_2 has shape [256, 64], expected [320, 64]" in msg
    assert "phoenix_model/unembeddings is missing (expected shape [64, 19] [emb_size, num_actions])" in msg
    assert "phoenix_model/product_surface_embedding_table has shape [8, 64], expected [16, 64]" in msg
    assert f"{TOWER}/candidate_tower_projection_1 is unexpected" in msg
    assert_same_params(haiku_params(model), before)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_retrieval_file_round_trip(tmp_path, ext):
    model = init_recsys(PhoenixRetrievalModel(RecsysConfig(LECTURE, hash_vocab_size=64)), "random", 3)
    path = tmp_path / f"retrieval.{ext}"
    save_weights(model, path)
    rebuilt = model_from_weight_file(path)
    assert isinstance(rebuilt, PhoenixRetrievalModel) and rebuilt.config == model.config
    assert_same_params(haiku_params(rebuilt), haiku_params(model))


def test_project_file_with_the_old_names_still_loads(tmp_path):
    """Files written before the project used the original's names: recsys_model/... and num_actions."""
    cfg = RecsysConfig(LECTURE, action_names=("favorite_score", "reply_score", "repost_score", "click_score",
                                              "profile_click_score", "share_score", "dwell_score",
                                              "not_interested_score"), num_product_surfaces=8, hash_vocab_size=32)
    model = init_recsys(RecsysModel(cfg), "random", 4)
    new = {f"{m}/{n}": v for m, inner in haiku_params(model).items() for n, v in inner.items()}
    old_names = {"hash_tables/user_embeddings": "recsys_model/user_embeddings/embeddings",
                 "hash_tables/post_embeddings": "recsys_model/post_embeddings/embeddings",
                 "hash_tables/author_embeddings": "recsys_model/author_embeddings/embeddings",
                 "phoenix_model/product_surface_embedding_table": "recsys_model/product_surface_embeddings/embeddings",
                 "phoenix_model/action_projection": "recsys_model/action_projection/w",
                 "phoenix_model/proj_mat_1": "recsys_model/user_projection/w",
                 "phoenix_model/proj_mat_2": "recsys_model/candidate_projection/w",
                 "phoenix_model/proj_mat_3": "recsys_model/history_projection/w",
                 "phoenix_model/rms_norm/scale": "recsys_model/rms_norm/scale",
                 "phoenix_model/unembeddings": "recsys_model/unembedding/w"}
    old = {old_names.get(k, k): v for k, v in new.items()}
    config = {"model": "recsys", "recsys": {"transformer": dataclasses.asdict(LECTURE), "num_user_hashes": 2,
                                            "num_item_hashes": 2, "num_author_hashes": 2, "num_actions": 8,
                                            "num_product_surfaces": 8, "hash_vocab_size": 32, "num_user_tokens": 1}}
    path = tmp_path / "old.npz"
    np.savez(path, **old, __config__=np.frombuffer(json.dumps(config).encode(), dtype=np.uint8))
    rebuilt = model_from_weight_file(path)
    assert rebuilt.config == cfg
    assert_same_params(haiku_params(rebuilt), haiku_params(model))


def test_app_opens_a_jax_export(tmp_path):
    """The README's export: the original's params flattened to .npz, no config, no hash tables.
    The app's upload accepts it for a matching geometry, and the model it serves holds those params."""
    from explorer import runs
    from server import uploads
    from explorer.schema import Settings
    params = original_params("phoenix_model", seed=5)
    path = tmp_path / "phoenix.npz"
    np.savez(path, **{f"{module}/{name}": np.asarray(value, np.float32)
                      for module, inner in params.items() for name, value in inner.items()})
    s = Settings(preset="lecture")
    assert s.transformer_config().ffn_hidden == LECTURE.ffn_hidden
    name = uploads.load_upload(s, str(path), session="a visitor")
    runs.serve_uploads(uploads.state_of)                    # as app.build_app does at start-up
    served = runs.build_model(dataclasses.replace(s, weights=f"upload:{name}"))
    got = haiku_params(served, hash_tables=False)
    assert_same_params(got, params)
    # the file has no hash tables: the app looks hashes up in the seeded tables of its random weights
    seeded = init_recsys(RecsysModel(served.config), "random", s.seed)
    assert_bit_exact(served.post_embeddings.weight.cpu(), seeded.post_embeddings.weight, "same computation")
    # a file for another geometry is refused, naming what differs
    with pytest.raises(Exception, match="(?s)weights file.*proj_mat_1 has shape"):
        uploads.load_upload(dataclasses.replace(s, emb_size=128, key_size=32), str(path), "a visitor")


# --- values: checked in the model's dtype, bounded, real floating point only ----------------

def one_bad(value, key=("transformer/decoder_layer_1/linear", "w")):
    params = random_params(seed=9)
    params[key[0]][key[1]] = value
    return params


@pytest.mark.parametrize("value,message", [
    (np.full((64, 176), 1e300, np.float64), r"linear/w contains NaN or infinity as float32 \(the model's dtype\)"),
    (np.full((64, 176), 1e30, np.float32), r"linear/w has a value of magnitude 1e\+30; allowed: at most 1e\+04"),
    (np.full((64, 176), -2e4, np.float16), r"magnitude 2e\+04; allowed: at most 1e\+04"),
    (torch.full((64, 176), 1e300, dtype=torch.float64), "NaN or infinity as float32"),
    (np.ones((64, 176), np.complex64), r"linear/w has dtype complex64; allowed: a real floating dtype"),
    (torch.ones((64, 176), dtype=torch.complex64), "has dtype complex64; allowed"),
    (np.ones((64, 176), np.int8), "linear/w has dtype int8; allowed"),
    (np.ones((64, 176), bool), "linear/w has dtype bool; allowed"),
    (torch.ones((64, 176), dtype=torch.int32), "has dtype int32; allowed"),
])
def test_values_are_checked_after_the_cast_and_only_real_floats_load(value, message):
    """float64 1e300 is finite until cast to the model's fp32; 1e30 is finite but overflows the
    forward; complex would lose its imaginary part and ints/bool are no weights: all refused by name."""
    model = init_params(Transformer(CFG), "random", 0)
    before = haiku_params(model)
    with pytest.raises(ValueError, match=message):
        load_haiku_params(model, one_bad(value))
    assert_same_params(haiku_params(model), before)


def test_weights_within_the_bound_load_exactly_in_any_float_dtype():
    params = random_params(seed=10)
    w = params["transformer/decoder_layer_0/linear_v"]["w"]
    w[0, 0] = 1e4                                            # the bound itself is allowed
    params["transformer/decoder_layer_0/linear_v"]["w"] = w.astype(">f8")     # big-endian float64
    params["transformer/decoder_layer_0/linear"]["w"] = torch.from_numpy(
        params["transformer/decoder_layer_0/linear"]["w"]).bfloat16()
    model = load_haiku_params(Transformer(CFG), params)
    assert model.layers[0].dense_block.linear_v.w[0, 0].item() == 1e4
    assert_bit_exact(model.layers[0].dense_block.linear.w,                       # bf16 widens exactly
                     params["transformer/decoder_layer_0/linear"]["w"].float(), "no rounding")


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.complex64])
def test_files_with_integer_bool_or_complex_weights_are_refused(tmp_path, ext, dtype):
    params = random_params(seed=11)
    flat = {f"{m}/{n}": v for m, inner in params.items() for n, v in inner.items()}
    flat["transformer/decoder_layer_0/rms_norm/scale"] = np.ones(64, dtype)
    path = tmp_path / f"w.{ext}"
    if ext == "npz":
        np.savez(path, **flat)
    else:
        if dtype is np.complex64:
            pytest.skip("safetensors.numpy writes no complex dtype")
        from safetensors.numpy import save_file
        save_file(flat, str(path))
    with pytest.raises(ValueError, match=f"rms_norm/scale has dtype {np.dtype(dtype).name}; allowed"):
        load_weights(Transformer(CFG), path)


def test_a_message_lists_a_few_problems_and_counts_the_rest():
    params = random_params(seed=12)
    for i in range(20_000):
        params[f"extra/module_{i}"] = {"w": np.zeros(1, np.float32)}
    params["x" * 100_000] = {"w": np.zeros(1, np.float32)}
    del params["transformer/decoder_layer_1/rms_norm_2"]
    with pytest.raises(ValueError) as e:
        load_haiku_params(Transformer(CFG), params)
    msg = str(e.value)
    assert len(msg) < 3000, len(msg)
    assert msg.startswith("weights: 20,002 problem(s)")
    assert "rms_norm_2/scale is missing" in msg.splitlines()[1]           # the telling problems first
    assert msg.splitlines()[-1].strip() == "... and 19,994 more"


# --- archives: counts, declared shapes and bytes checked before reading ----------------------

def test_npz_with_too_many_members_is_refused_before_its_directory_is_read(tmp_path):
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(5000):
            z.writestr(f"k{i}.npy", b"")
    with pytest.raises(ValueError, match="weights file: 'many.npz' holds 5,000 arrays; allowed: at most 4,096"):
        read_weight_file(path)


def npy_bytes(shape, descr="<f4", data=b"\0" * 16):
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def test_npz_member_declaring_a_huge_shape_is_refused_by_name(tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("transformer/decoder_layer_0/rms_norm/scale.npy", npy_bytes((10**14,)))
    with pytest.raises(ValueError, match=r"weights file: 'huge.npz' declares .*rms_norm/scale.npy' of shape "
                                         r"\[100000000000000\] float32: 400,000,000,000,000 bytes; allowed"):
        read_weight_file(path)
    # and a member shorter than its header says is named too
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("a.npy", npy_bytes((64,)))
    with pytest.raises(ValueError, match="'short.npz' could not be read as .npz .*shorter than its shape"):
        read_weight_file(tmp_path / "short.npz")


def safetensors_bytes(header: dict, data: bytes = b"\0" * 16) -> bytes:
    import json
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def test_safetensors_header_limits_are_checked_before_reading(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(safetensors_bytes({"k": {"dtype": "F32", "shape": [10**14], "data_offsets": [0, 16]}}))
    with pytest.raises(ValueError, match=r"'huge.safetensors' declares 'k' of shape \[100000000000000\] F32"):
        read_weight_file(path)
    path.write_bytes(safetensors_bytes({f"k{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                                        for i in range(5000)}))
    with pytest.raises(ValueError, match="'huge.safetensors' holds 5,000 arrays; allowed: at most 4,096"):
        read_weight_file(path)
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="could not be read as .safetensors .*header declares 1,099,511,627,776"):
        read_weight_file(path)
    path.write_bytes(safetensors_bytes({"k": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}))
    with pytest.raises(ValueError, match="declares 'k' as dtype 'F32', shape \\[-4\\]; allowed"):
        read_weight_file(path)
    deep = b"[" * 100_000 + b"]" * 100_000          # nested past Python's recursion limit: named, not a crash
    path.write_bytes(len(deep).to_bytes(8, "little") + deep)
    with pytest.raises(ValueError, match="could not be read as .safetensors .*nested too deeply"):
        read_weight_file(path)


@pytest.mark.parametrize("query", ["preset=lecture&weights=random&multiplier=100&logit_cap=0",
                                   "preset=lecture&weights=random&emb_size=512&num_layers=4&num_q_heads=8&"
                                   "key_size=64&multiplier=100&cap_method=none"])
def test_the_magnitude_bound_keeps_the_worst_case_forward_finite(query):
    """Every parameter at +MAX_ABS_WEIGHT (all products aligned), no logit cap, the largest multiplier:
    the scores are finite, so weights that pass the check cannot overflow the forward."""
    from explorer.query_string import parse_query
    from models.haiku_tree import MAX_ABS_WEIGHT
    s = parse_query(query)
    model = RecsysModel(s.recsys_config())
    params = {m: {n: np.full_like(a, MAX_ABS_WEIGHT) for n, a in inner.items()}
              for m, inner in haiku_params(model).items()}
    load_haiku_params(model, params)
    with torch.no_grad():
        out = model(synthetic_batch(model.config, s.layout, seed=0), record=True)
    assert torch.isfinite(out.logits).all()


# --- production's (2026) ranker in files: its stacked names, and never the other family's ------------------

XREX_CFG = dict(emb_size=32, num_layers=2, num_q_heads=4, num_kv_heads=2, key_size=8, history_seq_len=4)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_xrex_file_round_trip_with_productions_names(tmp_path, ext):
    from models.xrex import STACK, XrexConfig, XrexRanker, init_xrex
    ranker = init_xrex(XrexRanker(XrexConfig(**XREX_CFG, primer_norm=True)), 3)
    path = tmp_path / f"x.{ext}"
    save_weights(ranker, path)
    keys = set(read_weight_file(path))
    assert f"{STACK}/multi_head_attention/qkv/w" in keys and "recsys_aggregated_model/unembeddings" in keys
    assert read_weight_file(path)[f"{STACK}/post_ffn_norm/scale"].shape == (2, 32)          # stacked on axis 0
    again = model_from_weight_file(path)
    assert again.config == ranker.config
    emb, valid = torch.randn(2, 9, 32), torch.ones(2, 9, dtype=torch.bool)
    with torch.no_grad():
        assert_bit_exact(again(emb, valid).logits, ranker(emb, valid).logits, "same computation")


def test_a_file_of_the_other_family_is_refused_as_such_and_nothing_loads(tmp_path):
    from models.weights import WrongFamily
    from models.xrex import XrexConfig, XrexRanker, init_xrex
    grok_path, xrex_path = tmp_path / "g.safetensors", tmp_path / "x.safetensors"
    save_weights(init_params(Transformer(CFG), "random", 0), grok_path)
    save_weights(init_xrex(XrexRanker(XrexConfig(**XREX_CFG)), 0), xrex_path)
    ranker = XrexRanker(XrexConfig(**XREX_CFG))
    before = haiku_params(ranker)
    with pytest.raises(WrongFamily, match=r"weights file: holds grok.py's per-layer names .*; allowed: "
                                          r"production's stacked names .* for XrexRanker") as e:
        load_weights(ranker, grok_path)
    assert e.value.found == "grok"
    assert_same_params(haiku_params(ranker), before)
    with pytest.raises(WrongFamily, match=r"holds production's stacked names .*; allowed: grok.py's") as e:
        load_weights(Transformer(CFG), xrex_path)
    assert e.value.found == "xrex"
