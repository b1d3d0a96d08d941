"""Sequence models for the wind tunnels, and the interpretability surface they share.

Four built-in families, one interface (``model(tokens, *, trace=None) -> [B, T, C]``
logits): the pre-norm causal :class:`Transformer`, and three controls capacity-matched to
it: the attention-free :class:`MLPControl`, the recurrent :class:`LSTMControl` and the
selective-SSM :class:`MambaControl`. A family is one :class:`SequenceModel` subclass,
registered by name with :func:`register_model`. A :class:`Trace` passed to one forward
call records named activations and applies interventions (see
:mod:`windtunnel.models.trace`).

    >>> import torch
    >>> from windtunnel.models import build_model, count_params, run_with_trace
    >>> model = build_model("transformer", {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    ...                     vocab_size=10, num_classes=4, max_len=8)
    >>> logits, trace = run_with_trace(model, torch.zeros(3, 8, dtype=torch.long), "blocks.*.attn.pattern")
    >>> logits.shape, trace.stack("blocks.*.attn.pattern").shape
    (torch.Size([3, 8, 4]), torch.Size([2, 3, 2, 8, 8]))
"""

from windtunnel.models.base import ROLES, Role, SequenceModel
from windtunnel.models.build import MODELS, build_model, model_class, register_model
from windtunnel.models.config import MLPConfig, ModelConfig, TransformerConfig
from windtunnel.models.lstm import LSTMConfig, LSTMControl
from windtunnel.models.mamba import MambaConfig, MambaControl
from windtunnel.models.mlp import MLPControl
from windtunnel.models.names import mixer_control_names, mlp_control_names, transformer_names
from windtunnel.models.params import PARTS, count_params, params_by_part, unwrap_model
from windtunnel.models.sizing import MLPSizing, match_transformer, mlp_param_count, size_mlp, transformer_param_count
from windtunnel.models.trace import Trace, Traceable, run_with_trace
from windtunnel.models.transformer import Transformer

__all__ = [
    "MODELS",
    "PARTS",
    "ROLES",
    "LSTMConfig",
    "LSTMControl",
    "MLPConfig",
    "MLPControl",
    "MambaConfig",
    "MambaControl",
    "MLPSizing",
    "ModelConfig",
    "Role",
    "SequenceModel",
    "Trace",
    "Traceable",
    "Transformer",
    "TransformerConfig",
    "build_model",
    "count_params",
    "match_transformer",
    "mixer_control_names",
    "mlp_control_names",
    "mlp_param_count",
    "model_class",
    "params_by_part",
    "register_model",
    "run_with_trace",
    "size_mlp",
    "transformer_names",
    "transformer_param_count",
    "unwrap_model",
]
