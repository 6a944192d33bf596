"""Haiku parameter trees, checked: the nested ``{module_path: {param_name: array}}`` mapping haiku's init
returns, its flat ``"module_path/param_name"`` form, and the one check every loader (grok.py's family in
models.weights, production's in models.xrex) runs before it loads anything."""
from __future__ import annotations

from typing import Mapping, Union

import numpy as np
import torch

FIELD = "weights"


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


# What a weight may hold. Trained transformer weights are O(1) (variance-scaled init, RMSNorm scales
# near 1); MAX_ABS_WEIGHT leaves room for any of them and keeps the fp32 forward finite: every matmul
# reads an embedding or an RMSNorm output (L1 norm <= |scale| * emb_size), so at the explorer's sizes
# activations stay below ~1e12 before the FFN and ~1e32 after it, under fp32's 3.4e38 (and the norm of
# a larger row rounds to 0, never NaN). tests/test_weights.py runs the worst case, every weight 1e4.
# Values are checked after the cast to the model's dtype, where float64's 1e300 is already inf.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
MAX_ABS_WEIGHT = 1e4
MAX_LISTED = 8                   # problems spelled out in one message; the rest are counted


def shown_key(key: str) -> str:
    """A key as a message shows it: file keys are anyone's text, so long ones are cut."""
    return key if len(key) <= 100 else key[:97] + "..."


def _dtype_name(value) -> str:
    if isinstance(value, np.ndarray):
        return value.dtype.name              # '>f4' is float32 too
    return str(value.dtype).removeprefix("torch.")


def _as_tensor(value, shape: tuple, dtype: torch.dtype) -> Union[torch.Tensor, str]:
    """numpy, jax, torch or anything with __array__ -> a tensor of the model's dtype, or what is wrong
    with it: not an array, not a real floating dtype (complex, ints and bool are refused, never
    cast), the wrong shape, or values that are not finite or too large once cast."""
    if not isinstance(value, torch.Tensor):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError) as e:
            return f"is not a numeric array ({str(e)[:100]})"
    if _dtype_name(value) not in FLOAT_DTYPES:
        return f"has dtype {_dtype_name(value)}; allowed: a real floating dtype ({', '.join(FLOAT_DTYPES)})"
    if tuple(value.shape) != shape:
        return f"has shape {list(value.shape)}, expected {list(shape)}"
    if isinstance(value, np.ndarray):
        if value.dtype.name == "bfloat16":                  # ml_dtypes (jax): exact in float32
            value = value.astype(np.float32)
        value = torch.from_numpy(np.array(value, dtype=value.dtype.newbyteorder("="), copy=True))
    t = value.detach().to("cpu", dtype)
    if not torch.isfinite(t).all():
        return f"contains NaN or infinity as {_dtype_name(t)} (the model's dtype)"
    largest = t.abs().max().item() if t.numel() else 0.0
    if largest > MAX_ABS_WEIGHT:
        return (f"has a value of magnitude {largest:.3g}; allowed: at most {MAX_ABS_WEIGHT:.0e} "
                f"(larger weights overflow the forward)")
    return t


def checked_arrays(spec: Mapping[str, tuple], flat: Mapping, field: str, config: str,
                   dtype: torch.dtype = torch.float32) -> dict[str, np.ndarray]:
    """The arrays of a flat ``{key: array}`` mapping, checked against ``spec`` (key -> (target, shape,
    what the shape is)) and returned in `dtype`, the model's (values are checked after that cast). On
    any problem one ValueError names the keys at fault (a few, and a count of the rest), against
    `config` (the geometry in words), so the caller loads nothing. Shared by every loader (grok.py's
    and xrex's)."""
    missing = [f"{key} is missing (expected shape {list(spec[key][1])} {spec[key][2]})"
               for key in sorted(set(spec) - set(flat))]
    unexpected = [f"{shown_key(key)} is unexpected (this model has no such parameter)"
                  for key in sorted(set(flat) - set(spec))]
    wrong, arrays = [], {}
    for key in [k for k in spec if k in flat]:
        _, shape, why = spec[key]
        t = _as_tensor(flat[key], shape, dtype)
        if isinstance(t, str):
            wrong.append(f"{key} {t}" + (f" {why}" if t.startswith("has shape") else ""))
        else:
            arrays[key] = t.numpy()
    problems = missing + wrong + unexpected          # the least telling last: extra keys
    if problems:
        listed = problems[:MAX_LISTED] + ([f"... and {len(problems) - MAX_LISTED:,} more"]
                                          if len(problems) > MAX_LISTED else [])
        raise ValueError(f"{field}: {len(problems):,} problem(s) against the config ({config}); nothing was "
                         f"loaded:\n  " + "\n  ".join(listed))
    return arrays
