"""What the server sent, decoded: a gr.Plot value as plotly traces, arrays or a go.Figure."""
import base64
import json

import numpy as np


def plot_data(plot) -> list[dict]:
    """A gr.Plot value -> the plotly traces."""
    return json.loads(plot["plot"])["data"]


def array(value) -> np.ndarray:
    """plotly 6 sends numpy arrays as base64 typed arrays ({dtype, bdata, shape}); lists stay lists. float64."""
    return np.asarray(decoded(value), dtype=float)


def decoded(value):
    """`value` with every typed array in it ({dtype, bdata, shape}) an ndarray of its own dtype."""
    if isinstance(value, dict) and "bdata" in value:
        shape = [int(n) for n in str(value.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).reshape(shape)
    if isinstance(value, dict):
        return {k: decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value


class Drawn(dict):
    """A decoded figure read as a go.Figure reads (``fig.data[0].colorbar.title.text``), without plotly's
    validation rewriting what was sent (a named colour scale stays its name); an absent key reads None."""

    def __getattr__(self, name):
        return _drawn(self.get(name))


def _drawn(value):
    if isinstance(value, dict):
        return Drawn({k: _drawn(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_drawn(v) for v in value]
    return value


def figure(plot) -> Drawn:
    """A gr.Plot value -> the figure the server drew, as it sent it (arrays in the dtype it sent)."""
    return _drawn(decoded(json.loads(plot["plot"])))
