"""The models: knows nothing of the UI."""
from .attention import BACKENDS, attend, unavailable_reason  # noqa: F401
from .grok import (TransformerConfig, Transformer, ffn_size, init_params, make_recsys_attn_mask,  # noqa: F401
                   ROPE_MODES, INIT_MODES)
from .masks import MASK_KINDS, AttentionMask  # noqa: F401
from .presets import PRESETS, get_preset  # noqa: F401
from .recsys import (ACTIONS, PhoenixRetrievalModel, RecsysBatch, RecsysConfig, RecsysEmbeddings,  # noqa: F401
                     RecsysModel, SequenceLayout, init_recsys, synthetic_batch)
