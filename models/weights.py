"""Weights from and to the original: Haiku parameter mappings and weight files.

grok.py's ``hk.transform(...).init`` returns a nested ``{module_path: {param_name: array}}``
mapping; ``haiku_params`` writes exactly that for our ``Transformer`` and ``load_haiku_params``
reads it back, checking every key and shape first and loading nothing when anything is wrong.
Linear weights are ``[in, out]`` on both sides, so loading is a copy.

Paths (FACTS.md §1), trunk::

    transformer/decoder_layer_{i}/rms_norm{,_1,_2,_3}/scale                   [D]
    transformer/decoder_layer_{i}/multi_head_attention/{query,key,value}/w   [D, heads*K]
    transformer/decoder_layer_{i}/multi_head_attention/linear/w              [Hq*K, D]
    transformer/decoder_layer_{i}/{linear,linear_v}/w                        [D, F]
    transformer/decoder_layer_{i}/linear_1/w                                 [F, D]

The ranking model (``RecsysModel``) adds, under ``recsys_model/`` (hk.Embed calls its table
``embeddings``, hk.Linear its weight ``w``)::

    recsys_model/{user,post,author,product_surface}_embeddings/embeddings    [vocab, D]
    recsys_model/action_projection/w                                         [num_actions, D]
    recsys_model/{user,history,candidate}_projection/w                       [in, out]
    recsys_model/rms_norm/scale                                              [D]
    recsys_model/unembedding/w                                               [D, num_actions]

Files: ``.npz`` or ``.safetensors`` with flattened ``module_path/param_name`` keys, never
pickle. The model's config travels with the weights as JSON (safetensors metadata
``config``; in npz a ``__config__`` uint8 entry) so ``model_from_weight_file`` can rebuild it.
"""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import asdict
from typing import Mapping, Optional, Union

import numpy as np
import torch
from torch import nn

from .grok import Transformer, TransformerConfig
from .recsys import RecsysConfig, RecsysModel

FIELD = "weights"
FILE_FIELD = "weights file"
EXTENSIONS = (".npz", ".safetensors")
CONFIG_KEY = "__config__"            # npz entry (uint8 JSON) / safetensors metadata key "config"
DEFAULT_MAX_BYTES = 4 * 2**30         # phoenix-prod's trunk alone is ~1.3 GB in fp32

Model = Union[Transformer, RecsysModel]


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


def recsys_spec(c: RecsysConfig) -> dict[str, tuple[str, tuple, str]]:
    D, V, A = c.emb_size, c.hash_vocab_size, c.num_actions
    items = c.num_item_hashes + c.num_author_hashes
    r = "recsys_model"
    spec = {
        f"{r}/user_embeddings/embeddings": ("user_embeddings.weight", (V, D), "[hash_vocab_size, emb_size]"),
        f"{r}/post_embeddings/embeddings": ("post_embeddings.weight", (V, D), "[hash_vocab_size, emb_size]"),
        f"{r}/author_embeddings/embeddings": ("author_embeddings.weight", (V, D), "[hash_vocab_size, emb_size]"),
        f"{r}/product_surface_embeddings/embeddings": (
            "product_surface_embeddings.weight", (c.num_product_surfaces, D), "[num_product_surfaces, emb_size]"),
        f"{r}/action_projection/w": ("action_projection", (A, D), "[num_actions, emb_size]"),
        f"{r}/user_projection/w": ("user_projection.w", (c.num_user_hashes * D, c.num_user_tokens * D),
                                   "[num_user_hashes*emb_size, num_user_tokens*emb_size]"),
        f"{r}/history_projection/w": ("history_projection.w", (items * D + 2 * D, D),
                                      "[(num_item_hashes+num_author_hashes+2)*emb_size, emb_size]"),
        f"{r}/candidate_projection/w": ("candidate_projection.w", (items * D + D, D),
                                        "[(num_item_hashes+num_author_hashes+1)*emb_size, emb_size]"),
        f"{r}/rms_norm/scale": ("rms_norm.scale", (D,), "[emb_size]"),
        f"{r}/unembedding/w": ("unembedding", (D, A), "[emb_size, num_actions]"),
    }
    return {**spec, **trunk_spec(c.transformer, "transformer.")}


def param_spec(model: nn.Module) -> dict[str, tuple[str, tuple, str]]:
    if isinstance(model, RecsysModel):
        return recsys_spec(model.config)
    if isinstance(model, Transformer):
        return trunk_spec(model.config)
    raise ValueError(f"model: got {type(model).__name__}; allowed: Transformer or RecsysModel")


# --- nested haiku mapping <-> flat "module_path/param_name" keys ------------------------------

def flatten(params: Mapping) -> dict:
    """{module_path: {param_name: array}} -> {"module_path/param_name": array}."""
    if not isinstance(params, Mapping):
        raise ValueError(f"{FIELD}: got {type(params).__name__}; allowed: a mapping "
                         f"{{module_path: {{param_name: array}}}} as haiku's init returns")
    flat = {}
    for module, inner in params.items():
        if not isinstance(inner, Mapping):
            raise ValueError(f"{FIELD}: {module!r} maps to {type(inner).__name__}; allowed: a mapping "
                             f"{{param_name: array}}")
        for name, value in inner.items():
            flat[f"{module}/{name}"] = value
    return flat


def unflatten(flat: Mapping) -> dict[str, dict]:
    nested: dict[str, dict] = {}
    for key, value in flat.items():
        module, _, name = key.rpartition("/")
        nested.setdefault(module, {})[name] = value
    return nested


def _as_array(value) -> np.ndarray:
    """numpy, jax, torch or anything with __array__ -> a float numpy array (bf16 -> fp32)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().float().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind != "f" or arr.dtype not in (np.float16, np.float32, np.float64):
        arr = arr.astype(np.float32)   # ml_dtypes.bfloat16 from jax, ints
    return arr


def haiku_params(model: Model) -> dict[str, dict[str, np.ndarray]]:
    """The nested mapping haiku's ``transform(...).init`` returns, as fp32 numpy copies."""
    tensors = dict(model.named_parameters())
    flat = {key: tensors[name].detach().cpu().float().numpy().copy()
            for key, (name, _, _) in param_spec(model).items()}
    return unflatten(flat)


def checked_arrays(spec: Mapping[str, tuple], flat: Mapping, field: str, config: str) -> dict[str, np.ndarray]:
    """The arrays of a flat ``{key: array}`` mapping, checked against ``spec`` (key -> (target, shape,
    what the shape is)). On any problem one ValueError names every key at fault, against `config` (the
    geometry in words), so the caller loads nothing. Shared by every loader (grok.py's and xrex's)."""
    problems, arrays = [], {}
    for key in sorted(set(spec) - set(flat)):
        problems.append(f"{key} is missing (expected shape {list(spec[key][1])} {spec[key][2]})")
    for key in sorted(set(flat) - set(spec)):
        problems.append(f"{key} is unexpected (this model has no such parameter)")
    for key in [k for k in spec if k in flat]:
        _, shape, why = spec[key]
        try:
            arr = _as_array(flat[key])
        except (TypeError, ValueError) as e:
            problems.append(f"{key} is not a numeric array ({e})")
            continue
        if tuple(arr.shape) != shape:
            problems.append(f"{key} has shape {list(arr.shape)}, expected {list(shape)} {why}")
        elif not np.isfinite(arr).all():
            problems.append(f"{key} contains NaN or infinity")
        else:
            arrays[key] = arr
    if problems:
        raise ValueError(f"{field}: {len(problems)} problem(s) against the config ({config}); nothing was "
                         f"loaded:\n  " + "\n  ".join(problems))
    return arrays


def _load_flat(model: Model, flat: Mapping, field: str = FIELD) -> None:
    spec = param_spec(model)
    cfg = model.config.transformer if isinstance(model, RecsysModel) else model.config
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

    Every key and shape is checked against the config first; on any problem a ValueError lists
    all of them and the model keeps its weights."""
    _load_flat(model, flatten(params))
    return model


# --- files ----------------------------------------------------------------------------------

def _config_json(model: Model) -> str:
    if isinstance(model, RecsysModel):
        return json.dumps({"model": "recsys", "recsys": asdict(model.config)})
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
    return _read_safetensors(path)


def _read_npz(path: str, max_bytes: int):
    name = os.path.basename(path)
    try:
        with zipfile.ZipFile(path) as z:
            # compressed members could expand far beyond the file size: cap what they unpack to
            unpacked = sum(info.file_size for info in z.infolist())
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{FILE_FIELD}: {name!r} is not a valid .npz archive ({e})") from None
    if unpacked > max_bytes:
        raise ValueError(f"{FILE_FIELD}: {name!r} unpacks to {unpacked:,} bytes; allowed: at most {max_bytes:,}")
    arrays, config = {}, None
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                arr = data[key]   # raises ValueError on object (pickled) arrays
                if key == CONFIG_KEY:
                    config = arr.astype(np.uint8).tobytes().decode("utf-8")
                else:
                    arrays[key] = arr
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise ValueError(f"{FILE_FIELD}: {name!r} contains pickled objects; refused (only plain numeric "
                             f"arrays are loaded, never pickle)") from None
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .npz ({e})") from None
    except (OSError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .npz ({e})") from None
    return arrays, config


def _read_safetensors(path: str):
    from safetensors import safe_open
    name = os.path.basename(path)
    try:
        # framework "pt" reads bf16 too, which numpy has no dtype for
        with safe_open(path, framework="pt") as f:
            config = (f.metadata() or {}).get("config")
            arrays = {}
            for key in f.keys():
                t = f.get_tensor(key)
                arrays[key] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    except Exception as e:  # safetensors raises its own SafetensorError for malformed headers
        raise ValueError(f"{FILE_FIELD}: {name!r} could not be read as .safetensors ({e})") from None
    return arrays, config


def read_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` / ``.safetensors`` weight file by flat ``module_path/param_name`` key."""
    return _read(path, max_bytes)[0]


def _parse_config(config: Optional[str]) -> Optional[Union[TransformerConfig, RecsysConfig]]:
    if config is None:
        return None
    try:
        d = json.loads(config)
        if d.get("model") == "recsys":
            r = dict(d["recsys"])
            return RecsysConfig(transformer=TransformerConfig(**r.pop("transformer")), **r)
        if d.get("model") == "transformer":
            return TransformerConfig(**d["transformer"])
        raise KeyError("model")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{FILE_FIELD}: its stored config is not valid ({e})") from None


def config_from_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES
                            ) -> Optional[Union[TransformerConfig, RecsysConfig]]:
    """The config ``save_weights`` stored with the weights; None when the file carries none
    (e.g. exported from JAX): then build the model yourself and call ``load_weights``."""
    return _parse_config(_read(path, max_bytes)[1])


def load_weights(model: Model, path, max_bytes: int = DEFAULT_MAX_BYTES) -> Model:
    """Load a weight file into ``model`` (Transformer or RecsysModel); all-or-nothing, like
    ``load_haiku_params``. Shapes are checked, not the non-geometric config fields: use
    ``config_from_weight_file`` / ``model_from_weight_file`` to rebuild the exact model."""
    _load_flat(model, read_weight_file(path, max_bytes), FILE_FIELD)
    return model


def model_from_weight_file(path, max_bytes: int = DEFAULT_MAX_BYTES) -> Model:
    """Rebuild the model a file was saved from (needs the stored config) and load its weights."""
    arrays, config = _read(path, max_bytes)
    config = _parse_config(config)
    if config is None:
        raise ValueError(f"{FILE_FIELD}: {os.path.basename(os.fspath(path))!r} carries no config; "
                         f"build the model with its TransformerConfig and call load_weights")
    model = RecsysModel(config) if isinstance(config, RecsysConfig) else Transformer(config)
    _load_flat(model, arrays, FILE_FIELD)
    return model


__all__ = ["haiku_params", "load_haiku_params", "save_weights", "load_weights", "read_weight_file",
           "config_from_weight_file", "model_from_weight_file", "trunk_spec", "recsys_spec", "flatten",
           "unflatten", "checked_arrays", "DEFAULT_MAX_BYTES", "EXTENSIONS", "SAVE_DTYPES"]
