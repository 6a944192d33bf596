"""Weights from and to the original: Haiku parameter mappings and weight files.

grok.py's ``hk.transform(...).init`` returns a nested ``{module_path: {param_name: array}}``
mapping; ``haiku_params`` writes exactly that for our ``Transformer`` and ``load_haiku_params``
reads it back, checking every key and shape first and loading nothing when anything is wrong.
Linear weights are ``[in, out]`` on both sides, so loading is a copy.

Paths (docs/originals.md §1), trunk::

    transformer/decoder_layer_{i}/rms_norm{,_1,_2,_3}/scale                   [D]
    transformer/decoder_layer_{i}/multi_head_attention/{query,key,value}/w   [D, heads*K]
    transformer/decoder_layer_{i}/multi_head_attention/linear/w              [Hq*K, D]
    transformer/decoder_layer_{i}/{linear,linear_v}/w                        [D, F]
    transformer/decoder_layer_{i}/linear_1/w                                 [F, D]

The original's models (``recsys_model.py``, ``recsys_retrieval_model.py``) keep their own
parameters with ``hk.get_parameter`` directly under their module, so the ranker (``RecsysModel``)
adds, exactly as its ``init`` returns them::

    phoenix_model/proj_mat_1                        [num_user_hashes*D, D]          user
    phoenix_model/proj_mat_2                        [(n_item+n_author+1)*D, D]      candidate
    phoenix_model/proj_mat_3                        [(n_item+n_author+2)*D, D]      history
    phoenix_model/action_projection                 [num_actions, D]
    phoenix_model/product_surface_embedding_table   [product_surface_vocab_size, D]
    phoenix_model/unembeddings                      [D, num_actions]
    phoenix_model/rms_norm/scale                    [D]

and the retrieval model (``PhoenixRetrievalModel``)::

    phoenix_retrieval_model/{proj_mat_1,proj_mat_3,action_projection,product_surface_embedding_table}
    phoenix_retrieval_model/~build_candidate_representation/candidate_tower/
        candidate_tower_projection_1    [(n_item+n_author)*D, 2D]
        candidate_tower_projection_2    [2D, D]

(Haiku names a submodule made in a method other than ``__call__`` ``parent/~method/child``: the
original makes its ``CandidateTower`` inside ``build_candidate_representation``.)

The original looks the hash embeddings up outside the model; the project's own tables are
``hash_tables/{user,post,author}_embeddings`` [hash_vocab_size, D], optional when loading (the
model keeps its own) and left out of ``haiku_params(model, hash_tables=False)``, so a mapping
from the original's ``init`` round-trips unchanged. Files written before the project used the
original's names (``recsys_model/...``) are read through ``LEGACY_NAMES``.

Production's 2026 ranker (``models.xrex.XrexRanker``) has its own tree, layers stacked on axis 0
(``transformer/layer_stack/decoder_layer_0/...``, ``recsys_aggregated_model/...``: see
``models.xrex.param_spec``); the file functions below take it too, and a file holding one family's
names offered to the other family's model is refused as such (``WrongFamily``).

Files: ``.npz`` or ``.safetensors`` with flattened ``module_path/param_name`` keys, never
pickle. The model's config travels with the weights as JSON (safetensors metadata
``config``; in npz a ``__config__`` uint8 entry) so ``model_from_weight_file`` can rebuild it.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from dataclasses import asdict
from typing import Mapping, Optional, Union

import numpy as np
import torch
from torch import nn

from .grok import Transformer, TransformerConfig
from .haiku_tree import FIELD, checked_arrays, flatten, shown_key, unflatten
from .recsys import ACTIONS, PhoenixRetrievalModel, RecsysConfig, RecsysModel
from .world import WORLD_ACTIONS
from .xrex import XrexConfig, XrexRanker, load_xrex_params, xrex_params

FILE_FIELD = "weights file"
EXTENSIONS = (".npz", ".safetensors")
CONFIG_KEY = "__config__"            # npz entry (uint8 JSON) / safetensors metadata key "config"
DEFAULT_MAX_BYTES = 4 * 2**30         # phoenix-prod's trunk alone is ~1.3 GB in fp32

Model = Union[Transformer, RecsysModel, PhoenixRetrievalModel, XrexRanker]


def _is_xrex(model) -> bool:
    return isinstance(model, XrexRanker)


# --- which family's names a mapping holds ------------------------------------------------------

FAMILY_ROOTS = {"grok": ("transformer/decoder_layer_", "phoenix_model/", "phoenix_retrieval_model/", "recsys_model/"),
                "xrex": ("transformer/layer_stack/", "recsys_aggregated_model/")}
FAMILY_NAMES = {"grok": "grok.py's per-layer names (transformer/decoder_layer_<i>/..., phoenix_model/...)",
                "xrex": "production's stacked names (transformer/layer_stack/decoder_layer_0/..., "
                        "recsys_aggregated_model/...)"}


class WrongFamily(ValueError):
    """Weights holding one model family's parameter names, offered to the other family's model.
    `found`: the family whose names they hold ("grok" or "xrex")."""

    def __init__(self, message: str, found: str):
        super().__init__(message)
        self.found = found


def weight_family(keys) -> Optional[str]:
    """"grok" or "xrex" when every recognised key of a flat mapping is that family's, else None."""
    found = {family for key in keys for family, roots in FAMILY_ROOTS.items() if str(key).startswith(roots)}
    return found.pop() if len(found) == 1 else None


def _check_family(model: Model, flat: Mapping, field: str) -> None:
    want, found = "xrex" if _is_xrex(model) else "grok", weight_family(flat)
    if found is not None and found != want:
        raise WrongFamily(f"{field}: holds {FAMILY_NAMES[found]}; allowed: {FAMILY_NAMES[want]} for "
                          f"{type(model).__name__}", found)


# --- the name map: haiku key -> (torch parameter name, expected shape, what the shape is) --------

def trunk_spec(c: TransformerConfig, torch_prefix: str = "") -> dict[str, tuple[str, tuple, str]]:
    D, K, F = c.emb_size, c.key_size, c.ffn_hidden
    q, kv = c.num_q_heads * K, c.num_kv_heads * K
    spec = {}
    for i in range(c.num_layers):
        hk, pt = f"transformer/decoder_layer_{i}", f"{torch_prefix}layers.{i}"
        for norm in ("rms_norm", "rms_norm_1", "rms_norm_2", "rms_norm_3"):
            spec[f"{hk}/{norm}/scale"] = (f"{pt}.{norm}.scale", (D,), "[emb_size]")
        for name, shape, why in (("query", (D, q), "[emb_size, num_q_heads*key_size]"),
                                 ("key", (D, kv), "[emb_size, num_kv_heads*key_size]"),
                                 ("value", (D, kv), "[emb_size, num_kv_heads*key_size]"),
                                 ("linear", (q, D), "[num_q_heads*key_size, emb_size]")):
            spec[f"{hk}/multi_head_attention/{name}/w"] = (f"{pt}.multi_head_attention.{name}.w", shape, why)
        for name, shape, why in (("linear", (D, F), "[emb_size, ffn_size]"),
                                 ("linear_v", (D, F), "[emb_size, ffn_size]"),
                                 ("linear_1", (F, D), "[ffn_size, emb_size]")):
            spec[f"{hk}/{name}/w"] = (f"{pt}.dense_block.{name}.w", shape, why)
    return spec


HASH_TABLES = "hash_tables"


def _hash_table_spec(c: RecsysConfig) -> dict[str, tuple[str, tuple, str]]:
    V, D = c.hash_vocab_size, c.emb_size
    return {f"{HASH_TABLES}/{n}_embeddings": (f"{n}_embeddings.weight", (V, D), "[hash_vocab_size, emb_size]")
            for n in ("user", "post", "author")}


def _inputs_spec(c: RecsysConfig, root: str) -> dict[str, tuple[str, tuple, str]]:
    """What the ranker and the retrieval model share: block_user_reduce / block_history_reduce."""
    D, items = c.emb_size, c.num_item_hashes + c.num_author_hashes
    return {
        f"{root}/proj_mat_1": ("user_projection.w", (c.num_user_hashes * D, c.num_user_tokens * D),
                               "[num_user_hashes*emb_size, num_user_tokens*emb_size]"),
        f"{root}/proj_mat_3": ("history_projection.w", (items * D + 2 * D, D),
                               "[(num_item_hashes+num_author_hashes+2)*emb_size, emb_size]"),
        f"{root}/action_projection": ("action_projection", (c.num_actions, D), "[num_actions, emb_size]"),
        f"{root}/product_surface_embedding_table": (
            "product_surface_embeddings.weight", (c.num_product_surfaces, D), "[num_product_surfaces, emb_size]"),
        **_hash_table_spec(c), **trunk_spec(c.transformer, "transformer."),
    }


def recsys_spec(c: RecsysConfig) -> dict[str, tuple[str, tuple, str]]:
    D, items, r = c.emb_size, c.num_item_hashes + c.num_author_hashes, "phoenix_model"
    return {
        **_inputs_spec(c, r),
        f"{r}/proj_mat_2": ("candidate_projection.w", (items * D + D, D),
                            "[(num_item_hashes+num_author_hashes+1)*emb_size, emb_size]"),
        f"{r}/unembeddings": ("unembedding", (D, c.num_actions), "[emb_size, num_actions]"),
        f"{r}/rms_norm/scale": ("rms_norm.scale", (D,), "[emb_size]"),
    }


# made inside PhoenixRetrievalModel.build_candidate_representation, hence haiku's "~method/" in its path
CANDIDATE_TOWER = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"


def retrieval_spec(c: RecsysConfig) -> dict[str, tuple[str, tuple, str]]:
    D, items, r = c.emb_size, c.num_item_hashes + c.num_author_hashes, "phoenix_retrieval_model"
    return {
        **_inputs_spec(c, r),
        f"{CANDIDATE_TOWER}/candidate_tower_projection_1": (
            "candidate_tower.projection_1.w", (items * D, 2 * D),
            "[(num_item_hashes+num_author_hashes)*emb_size, 2*emb_size]"),
        f"{CANDIDATE_TOWER}/candidate_tower_projection_2": (
            "candidate_tower.projection_2.w", (2 * D, D), "[2*emb_size, emb_size]"),
    }


# keys of the project's files before it used the original's names -> the original's names
LEGACY_NAMES = {
    "recsys_model/user_embeddings/embeddings": f"{HASH_TABLES}/user_embeddings",
    "recsys_model/post_embeddings/embeddings": f"{HASH_TABLES}/post_embeddings",
    "recsys_model/author_embeddings/embeddings": f"{HASH_TABLES}/author_embeddings",
    "recsys_model/product_surface_embeddings/embeddings": "phoenix_model/product_surface_embedding_table",
    "recsys_model/action_projection/w": "phoenix_model/action_projection",
    "recsys_model/user_projection/w": "phoenix_model/proj_mat_1",
    "recsys_model/history_projection/w": "phoenix_model/proj_mat_3",
    "recsys_model/candidate_projection/w": "phoenix_model/proj_mat_2",
    "recsys_model/rms_norm/scale": "phoenix_model/rms_norm/scale",
    "recsys_model/unembedding/w": "phoenix_model/unembeddings",
}


def param_spec(model: nn.Module) -> dict[str, tuple[str, tuple, str]]:
    """grok.py's family; production's stacked tree is models.xrex.param_spec."""
    if isinstance(model, RecsysModel):
        return recsys_spec(model.config)
    if isinstance(model, PhoenixRetrievalModel):
        return retrieval_spec(model.config)
    if isinstance(model, Transformer):
        return trunk_spec(model.config)
    raise ValueError(f"model: got {type(model).__name__}; allowed: Transformer, RecsysModel or "
                     f"PhoenixRetrievalModel")


def haiku_params(model: Model, hash_tables: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """The nested mapping haiku's ``transform(...).init`` returns, as fp32 numpy copies.
    hash_tables=False leaves out the project's own hash tables, as the original's init does.
    An XrexRanker gives production's stacked tree (models.xrex.xrex_params)."""
    if _is_xrex(model):
        return xrex_params(model)
    tensors = dict(model.named_parameters())
    flat = {key: tensors[name].detach().cpu().float().numpy().copy()
            for key, (name, _, _) in param_spec(model).items()
            if hash_tables or not key.startswith(f"{HASH_TABLES}/")}
    return unflatten(flat)


def _load_flat(model: Model, flat: Mapping, field: str = FIELD) -> None:
    _check_family(model, flat, field)
    if _is_xrex(model):
        load_xrex_params(model, unflatten(flat), field=field)
        return
    flat = {LEGACY_NAMES.get(k, k): v for k, v in flat.items()}
    # the original keeps no hash tables: without them the model keeps its own
    spec = {k: v for k, v in param_spec(model).items() if k in flat or not k.startswith(f"{HASH_TABLES}/")}
    cfg = model.config if isinstance(model, Transformer) else model.config.transformer
    arrays = checked_arrays(spec, flat, field, f"emb_size={cfg.emb_size}, key_size={cfg.key_size}, "
                            f"num_q_heads={cfg.num_q_heads}, num_kv_heads={cfg.num_kv_heads}, "
                            f"num_layers={cfg.num_layers}, ffn_size={cfg.ffn_hidden}")
    tensors = dict(model.named_parameters())
    with torch.no_grad():
        for key, arr in arrays.items():
            p = tensors[spec[key][0]]
            p.copy_(torch.from_numpy(arr).to(p.dtype))


def load_haiku_params(model: Model, params: Mapping) -> Model:
    """Copy a haiku ``{module_path: {param_name: array}}`` mapping into the model.

    Takes what the original's ``init`` returns with no renaming (``phoenix_model/...`` or
    ``phoenix_retrieval_model/...`` and ``transformer/...``); the project's hash tables are optional.
    Every key and shape is checked against the config first; on any problem a ValueError lists
    all of them and the model keeps its weights."""
    _load_flat(model, flatten(params))
    return model


# --- files ----------------------------------------------------------------------------------

def _config_json(model: Model) -> str:
    if _is_xrex(model):
        return json.dumps({"model": "xrex", "xrex": asdict(model.config)})
    if isinstance(model, (RecsysModel, PhoenixRetrievalModel)):
        kind = "recsys" if isinstance(model, RecsysModel) else "retrieval"
        return json.dumps({"model": kind, "recsys": asdict(model.config)})
    return json.dumps({"model": "transformer", "transformer": asdict(model.config)})


SAVE_DTYPES = ("float32", "float16")


def save_weights(model: Model, path: Union[str, os.PathLike], dtype: str = "float32") -> None:
    """Write the flattened haiku keys (and the config as JSON) to ``.npz`` or ``.safetensors``.
    dtype "float16" halves the file (shipped demo weights); loading always gives the model's dtype."""
    path = os.fspath(path)
    ext = _extension(path)
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype: got {dtype!r}; allowed: {', '.join(SAVE_DTYPES)}")
    flat = {k: v.astype(dtype) for k, v in flatten(haiku_params(model)).items()}
    config = _config_json(model)
    if ext == ".npz":
        # np.savez would append .npz to a name without it; ours always has it
        np.savez(path, **flat, **{CONFIG_KEY: np.frombuffer(config.encode(), dtype=np.uint8)})
    else:
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(v) for k, v in flat.items()}, path, metadata={"config": config})


def _extension(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXTENSIONS:
        raise ValueError(f"{FILE_FIELD}: got {os.path.basename(path)!r}; allowed: a {' or '.join(EXTENSIONS)} "
                         f"file (pickle-based formats are never loaded)")
    return ext


def _read(path, max_bytes: int) -> tuple[dict[str, np.ndarray], Optional[str]]:
    """-> (arrays by flat key, config JSON or None)."""
    path = os.fspath(path)
    ext = _extension(path)
    if not os.path.isfile(path):
        raise ValueError(f"{FILE_FIELD}: {path!r} does not exist or is not a file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"{FILE_FIELD}: {os.path.basename(path)!r} is {size:,} bytes; allowed: at most "
                         f"{max_bytes:,} bytes")
    if ext == ".npz":
        return _read_npz(path, max_bytes)
    return _read_safetensors(path, max_bytes)


# Archive limits, checked before anything is read: how many arrays a file may hold (the largest
# preset has a few hundred parameters), how large its index may be (zip directory, safetensors
# header), and the bytes its arrays declare (shape x dtype) against the caller's max_bytes.
MAX_ARRAYS = 4096
MAX_INDEX_BYTES = MAX_ARRAYS * 1024
MAX_CONFIG_BYTES = 64 * 1024


def _too_many(name: str, count: int) -> ValueError:
    return ValueError(f"{FILE_FIELD}: {name!r} holds {count:,} arrays; allowed: at most {MAX_ARRAYS:,}")


def _too_large(name: str, what: str, size: int, allowed: int) -> ValueError:
    return ValueError(f"{FILE_FIELD}: {name!r} {what} {size:,} bytes; allowed: at most {allowed:,}")


def _zip_directory(path: str, name: str) -> tuple[int, int]:
    """(entries, directory bytes) as the zip's end record declares them, read without parsing the
    directory itself: 200,000 members take seconds to list. Zip64 (65,535+ entries) reads as 65,535."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - (22 + 65535)))          # end record + the longest comment
        tail = fh.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise ValueError(f"{FILE_FIELD}: {name!r} is not a valid .npz archive (no zip end record)")
    return struct.unpack("<HI", tail[at + 10:at + 16])


def _npz_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, budget: int) -> np.ndarray:
    """One .npy member: its header read first, its data only when the shape and dtype it declares
    fit in `budget` bytes. Object arrays (pickle) are refused, never loaded."""
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"npy format version {version} is not supported")
        shape, fortran_order, dtype = read_header(f)
        if dtype.hasobject:
            raise ValueError(f"{FILE_FIELD}: {name!r} contains pickled objects; refused (only plain numeric "
                             f"arrays are loaded, never pickle)")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > budget:
            raise _too_large(name, f"declares {shown_key(info.filename)!r} of shape {list(shape)} {dtype.name}:",
                             nbytes, budget)
        data = bytearray(nbytes)
        if f.readinto(data) != nbytes:
            raise ValueError(f"{shown_key(info.filename)!r} is shorter than its shape {list(shape)} declares")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")


def _read_npz(path: str, max_bytes: int):
    name = os.path.basename(path)
    entries, directory = _zip_directory(path, name)
    if entries > MAX_ARRAYS:
        raise _too_many(name, entries)
    if directory > MAX_INDEX_BYTES:
        raise _too_large(name, "has a zip directory of", directory, MAX_INDEX_BYTES)
    arrays, config, budget = {}, None, max_bytes
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if len(infos) > MAX_ARRAYS:
                raise _too_many(name, len(infos))
            # compressed members could expand far beyond the file size: cap what they unpack to
            unpacked = sum(info.file_size for info in infos)
            if unpacked > max_bytes:
                raise _too_large(name, "unpacks to", unpacked, max_bytes)
            for info in infos:
                key = info.filename.removesuffix(".npy")
                arr = _npz_member(z, info, name, MAX_CONFIG_BYTES if key == CONFIG_KEY else budget)
                budget -= arr.nbytes
                if key == CONFIG_KEY:
                    config = arr.astype(np.uint8).tobytes().decode("utf-8")
                else:
                    arrays[key] = arr
    except ValueError as e:
        if str(e).startswith(FILE_FIELD):
            raise
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .npz ({str(e)[:200]})") from None
    except (OSError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, NotImplementedError) as e:
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .npz ({str(e)[:200]})") from None
    return arrays, config


# bytes per element of each safetensors dtype
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _check_safetensors_header(path: str, name: str, max_bytes: int) -> None:
    """The header (8-byte length, then JSON {key: {dtype, shape, data_offsets}}) checked before the
    library reads anything: its size, the number of arrays, and the bytes their shapes declare."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= MAX_INDEX_BYTES:
            raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors (its header declares "
                             f"{length:,} bytes; allowed: 1 to {MAX_INDEX_BYTES:,})")
        try:
            header = json.loads(fh.read(length))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors (header: "
                             f"{str(e)[:100]})") from None
        except RecursionError:          # JSON nested thousands deep: no header of weights is
            raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors (header: JSON "
                             f"nested too deeply; allowed: an object of arrays)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors (header is no JSON object)")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(entries) > MAX_ARRAYS:
        raise _too_many(name, len(entries))
    total = 0
    for key, entry in entries.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if dtype not in SAFETENSORS_DTYPES or not isinstance(shape, list) or not all(
                isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"{FILE_FIELD}: {name!r} declares {shown_key(key)!r} as dtype {str(dtype)[:20]!r}, "
                             f"shape {str(shape)[:60]}; allowed: a dtype of {', '.join(SAFETENSORS_DTYPES)} and "
                             f"a list of sizes")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        total += nbytes
        if total > max_bytes:
            raise _too_large(name, f"declares {shown_key(key)!r} of shape {shape} {dtype}, arrays of at least",
                             total, max_bytes)


def _read_safetensors(path: str, max_bytes: int):
    from safetensors import safe_open
    name = os.path.basename(path)
    _check_safetensors_header(path, name, max_bytes)
    try:
        # framework "pt" reads bf16 too, which numpy has no dtype for
        with safe_open(path, framework="pt") as f:
            config = (f.metadata() or {}).get("config")
            arrays = {}
            for key in f.keys():
                t = f.get_tensor(key)
                arrays[key] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    except Exception as e:  # safetensors raises its own SafetensorError for malformed headers
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors ({str(e)[:200]})") from None
    return arrays, config


def read_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` / ``.safetensors`` weight file by flat ``module_path/param_name`` key."""
    return _read(path, max_bytes)[0]


def _parse_config(config: Optional[str]) -> Optional[Union[TransformerConfig, RecsysConfig, XrexConfig]]:
    if config is None:
        return None
    try:
        d = json.loads(config)
        if d.get("model") in ("recsys", "retrieval"):
            r = dict(d["recsys"])
            if "num_actions" in r:      # written before the config named its actions
                r["action_names"] = _legacy_action_names(r.pop("num_actions"))
            return RecsysConfig(transformer=TransformerConfig(**r.pop("transformer")), **r)
        if d.get("model") == "transformer":
            return TransformerConfig(**d["transformer"])
        if d.get("model") == "xrex":
            return XrexConfig(**d["xrex"])
        raise KeyError("model")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{FILE_FIELD}: its stored config is not valid ({e})") from None


def _legacy_action_names(n) -> tuple[str, ...]:
    """A file's ``num_actions`` -> names: the original's 19, or the project's first 8 (like, reply, ...),
    which are the demo world's names for the same actions, in the same order."""
    for names in (ACTIONS, WORLD_ACTIONS):
        if n == len(names):
            return names
    raise ValueError(f"num_actions: got {n!r}; allowed: {len(ACTIONS)} or {len(WORLD_ACTIONS)} in a file "
                     f"without action_names")


def config_from_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES
                            ) -> Optional[Union[TransformerConfig, RecsysConfig]]:
    """The config ``save_weights`` stored with the weights; None when the file carries none
    (e.g. exported from JAX): then build the model yourself and call ``load_weights``."""
    return _parse_config(_read(path, max_bytes)[1])


def load_weights(model: Model, path, max_bytes: int = DEFAULT_MAX_BYTES) -> Model:
    """Load a weight file into ``model`` (Transformer, RecsysModel, or production's XrexRanker from its
    stacked names); all-or-nothing, like ``load_haiku_params``. Shapes are checked, not the non-geometric config fields: use
    ``config_from_weight_file`` / ``model_from_weight_file`` to rebuild the exact model."""
    _load_flat(model, read_weight_file(path, max_bytes), FILE_FIELD)
    return model


def model_from_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES) -> Model:
    """Rebuild the model a file was saved from (needs the stored config) and load its weights."""
    arrays, stored = _read(path, max_bytes)
    config = _parse_config(stored)
    if config is None:
        raise ValueError(f"{FILE_FIELD}: {os.path.basename(os.fspath(path))!r} carries no config; "
                         f"build the model with its TransformerConfig and call load_weights")
    if isinstance(config, RecsysConfig):
        model = (PhoenixRetrievalModel if json.loads(stored)["model"] == "retrieval" else RecsysModel)(config)
    elif isinstance(config, XrexConfig):
        model = XrexRanker(config)
    else:
        model = Transformer(config)
    _load_flat(model, arrays, FILE_FIELD)
    return model


__all__ = ["haiku_params", "load_haiku_params", "save_weights", "load_weights", "read_weight_file",
           "config_from_weight_file", "model_from_weight_file", "trunk_spec", "recsys_spec", "retrieval_spec",
           "flatten", "unflatten", "checked_arrays", "weight_family", "WrongFamily", "DEFAULT_MAX_BYTES", "EXTENSIONS",
           "SAVE_DTYPES"]
