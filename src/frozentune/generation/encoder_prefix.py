"""Prefix-tuning (Li & Liang 2021) for a frozen bidirectional encoder (BERT family: `BertModel`,
e.g. sentence-transformers/all-MiniLM-L6-v2): every layer gets P trainable key and value vectors
that every token attends to, in addition to the real tokens. The encoder's weights are untouched;
only the prefix gets gradients.

Legend (as in prefix.py): B batch (rows), T tokens, P prefix positions, N layers, H heads,
E head dim, D hidden size. A prefix is (N, 2, H, P, E): `prefix[n, 0]` the keys and `prefix[n, 1]`
the values of layer n, each (H, P, E); or (B, N, 2, H, P, E), one prefix per row. A prefix mask
(B, P) bool marks the real slots of each row (False = a padding slot nobody attends to).

Mechanism (transformers 5.x BERT). Nothing is patched and no hook is installed; the prefix goes
in through two arguments of the model's own forward that BERT honours in encoder mode too:

* `past_key_values`: `BertSelfAttention.forward` projects the tokens to keys/values (B, H, T, E)
  and, whenever it is given a cache, replaces them by `cache.update(keys, values, layer_idx)`
  before calling the attention function of `config._attn_implementation`. `_PrefixKV` answers
  with [prefix; keys] and [prefix; values] (B, H, P+T, E) and stores nothing, so queries (B, H, T, E)
  attend over P+T slots. `BertModel.forward` also asks `get_seq_length()` to offset the position
  ids; `_PrefixKV` says 0, so real tokens keep positions 0..T-1, exactly as without a prefix (the
  prefix has no positions: its keys/values are given directly). NB: PEFT / P-tuning v2 on 4.x
  transformers shifted BERT positions by P instead, since BertEmbeddings then offset by the cache length.
* `attention_mask`: a 4D mask (B, 1, T, P+T) is passed through unchanged by
  `create_bidirectional_mask`. It is built here from [prefix mask; token mask] in the format of
  the attention implementation: bool (True = attend) for sdpa, additive float (0 / dtype min)
  for eager. Every token sees the real prefix slots and the real tokens of its row, never padding.

Safety: `_PrefixKV` counts its calls, and the forward is refused afterwards unless every layer
took its prefix exactly once (so a transformers version that stops routing the cache to BERT's
self-attention, or gradient checkpointing dropping it, is an error, never a silently prefix-less
output). Other attention implementations (flash, flex) take masks in other forms and are refused.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from ..backbone import LayerSpec, cache_kwargs, select_layers, token_type_kwargs
from ..head import Features, Head, Output, masked_mean
from .run import ByArchitecture
from .prefix import KVShape, PrefixConfig, PrefixEncoder, PrefixError, PrefixTuner, phrase_ids
from .seq2seq import Seq2SeqPrefixTuner
from ..registry import register_method

SUPPORTED_ATTENTION = ("eager", "sdpa")


def encoder_kv_shape(config: Any) -> KVShape:
    """N layers, H heads, E = D / H head dims of a BERT-like config (every query head has its own
    key/value head, so `KVShape.from_config` fits as is)."""
    return KVShape.from_config(config)


# ----------------------------------------------------------------------------- checks
def _bert(model: nn.Module) -> nn.Module:
    """The `BertModel` itself (or the one inside a BertFor… head model); anything else is refused."""
    from transformers import BertModel

    for candidate in (model, getattr(model, "base_model", None)):
        if isinstance(candidate, BertModel):
            bert = candidate
            break
    else:
        raise PrefixError(f"encoder prefix-tuning supports BERT encoders (transformers BertModel, e.g. "
                          f"all-MiniLM-L6-v2 loaded with AutoModel); got {type(model).__name__}, and other encoders "
                          f"(RoBERTa, DistilBERT, …) are not supported. A causal or encoder-decoder LM takes a prefix "
                          f"on generation data: frozentune train --method prefix --backbone LM --data e2e, webnlg, or "
                          f"a file of source → target pairs (--source-field, --target-field); in Python, "
                          f"frozentune.generation.prefix")
    if bert.config.is_decoder:
        raise PrefixError(f"{type(model).__name__} is configured as a decoder (is_decoder=True, causal mask); "
                          f"encoder prefix-tuning needs a bidirectional encoder: load it with is_decoder=False")
    impl = bert.config._attn_implementation
    if impl not in SUPPORTED_ATTENTION:
        raise PrefixError(f"attention implementation {impl!r} is not supported by encoder prefix-tuning; "
                          f"load the model with attn_implementation='sdpa' (or 'eager'), or call "
                          f"model.set_attn_implementation('sdpa')")
    if bert.training and any(getattr(layer, "gradient_checkpointing", False) for layer in bert.encoder.layer):
        raise PrefixError("activation (gradient) checkpointing in training mode drops past_key_values, and with it "
                          "the prefix; call model.activation_checkpointing_disable() (the model stays frozen, so "
                          "checkpointing it saves little) or model.eval()")
    return bert


def _check_prefix(prefix: Tensor, shape: KVShape, batch: int) -> Tensor:
    """(N, 2, H, P, E) or (B, N, 2, H, P, E) → (B, N, 2, H, P, E) (a view: gradients reach `prefix`)."""
    expected = f"({shape.layers}, 2, {shape.heads}, P, {shape.head_dim})"
    if prefix.dim() not in (5, 6):
        raise PrefixError(f"prefix of shape {tuple(prefix.shape)}: give (N, 2, H, P, E) = {expected}, "
                          f"or one per row (B, N, 2, H, P, E)")
    per_row = prefix.dim() == 6
    kv = prefix if per_row else prefix.unsqueeze(0)
    _, n, two, h, p, e = kv.shape
    if (n, two, h, e) != (shape.layers, 2, shape.heads, shape.head_dim):
        raise PrefixError(f"prefix of shape {tuple(prefix.shape)} does not fit this model: it needs "
                          f"{'(B, ' + expected[1:] if per_row else expected} "
                          f"(layers, keys/values, heads, positions, head dim); build it with "
                          f"encoder_kv_shape(model.config).tensor_shape(P)")
    if per_row and kv.shape[0] != batch:
        raise PrefixError(f"per-row prefix has {kv.shape[0]} rows but the input has {batch}; "
                          f"give one prefix per row, or a shared (N, 2, H, P, E) prefix")
    return kv.expand(batch, n, two, h, p, e)


def _check_mask(prefix_mask: Tensor | None, batch: int, length: int, device: torch.device) -> Tensor:
    """(B, P) bool, all True by default."""
    if prefix_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if tuple(prefix_mask.shape) != (batch, length):
        raise PrefixError(f"prefix_mask of shape {tuple(prefix_mask.shape)}: give (B, P) = ({batch}, {length}), "
                          f"True on the real prefix slots of each row")
    return prefix_mask.to(device=device, dtype=torch.bool)


# ----------------------------------------------------------------------------- the mechanism
class _PrefixKV:
    """Stands in for a transformers `Cache` in BERT self-attention: `update` puts layer n's prefix
    in front of the tokens' keys/values and stores nothing. keys[n], values[n]: (B, H, P, E)."""

    def __init__(self, keys: list[Tensor], values: list[Tensor]):
        self.keys, self.values = keys, values
        self.calls = [0] * len(keys)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """BertModel offsets position ids by this: 0, real tokens keep positions 0..T-1."""
        return 0

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """(B, H, T, E) keys and values → (B, H, P+T, E): [prefix; tokens]."""
        self.calls[layer_idx] += 1
        return (torch.cat([self.keys[layer_idx], key_states], dim=2),
                torch.cat([self.values[layer_idx], value_states], dim=2))


class _CaptureKV:
    """Stands in for a cache to read the keys/values every layer computes for the tokens (and
    returns them unchanged): the encoder's own activations on a phrase, for init=words."""

    def __init__(self, layers: int):
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        return key_states, value_states


@torch.no_grad()
def encoder_activations(model: nn.Module, ids: list[int]) -> Tensor:
    """The encoder's own keys/values (N, 2, H, P, E) on the tokens `ids` (no [CLS]/[SEP] added),
    P = len(ids): a prefix that starts as that phrase's activations (Li & Liang §7.4)."""
    bert = _bert(model)
    x = torch.tensor([list(ids)], device=bert.embeddings.word_embeddings.weight.device)
    cap = _CaptureKV(bert.config.num_hidden_layers)
    bert(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, **cache_kwargs(bert, cap))
    if any(k is None for k in cap.keys):
        raise PrefixError("could not read the encoder's keys/values on init_text: this transformers version no "
                          "longer passes its cache to BERT self-attention; use init=random")
    return torch.stack([torch.stack([k[0], v[0]]) for k, v in zip(cap.keys, cap.values)]).float()  # type: ignore[index]


def _attention_mask(allowed: Tensor, queries: int, impl: str, dtype: torch.dtype) -> Tensor:
    """(B, P+T) bool key mask → the 4D mask (B, 1, T, P+T) of implementation `impl`: bool
    (True = attend) for sdpa, additive float (0 / dtype min, as transformers' eager masks) for eager."""
    mask = allowed[:, None, None, :].expand(-1, 1, queries, -1)
    if impl == "sdpa":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def prefix_hidden_states(model: nn.Module, prefix: Tensor | None, input_ids: Tensor, attention_mask: Tensor,
                         prefix_mask: Tensor | None = None,
                         token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
    """The encoder's hidden states when every layer's self-attention also attends to the prefix:
    the tuple `output_hidden_states=True` gives (embeddings, then every layer), each (B, T, D).

    prefix: (N, 2, H, P, E) shared by all rows, (B, N, 2, H, P, E) one per row, or None (P = 0).
    input_ids, attention_mask: (B, T), the mask 1 on real tokens. prefix_mask: (B, P) bool, True on
    the real prefix slots (default all). token_type_ids: (B, T) for sentence pairs. Gradients flow into `prefix` (and into the model only if
    its parameters require them: a model from `load_encoder` is frozen)."""
    bert = _bert(model)
    shape = encoder_kv_shape(bert.config)
    b, t = input_ids.shape
    if tuple(attention_mask.shape) != (b, t):
        raise PrefixError(f"attention_mask of shape {tuple(attention_mask.shape)}; it must match input_ids ({b}, {t})")
    dtype = bert.embeddings.word_embeddings.weight.dtype
    device = input_ids.device
    if prefix is None:
        prefix = torch.zeros(shape.tensor_shape(0), dtype=dtype, device=device)
    kv = _check_prefix(prefix, shape, b).to(device=device, dtype=dtype)       # (B, N, 2, H, P, E)
    pmask = _check_mask(prefix_mask, b, kv.shape[4], device)                  # (B, P)
    allowed = torch.cat([pmask, attention_mask.to(device).bool()], dim=1)     # (B, P+T)
    cache = _PrefixKV([kv[:, n, 0] for n in range(shape.layers)], [kv[:, n, 1] for n in range(shape.layers)])
    mask = _attention_mask(allowed, t, bert.config._attn_implementation, dtype)
    types = None if token_type_ids is None else token_type_ids.to(device)
    out = bert(input_ids=input_ids, attention_mask=mask, use_cache=False, output_hidden_states=True,
               **cache_kwargs(bert, cache), **token_type_kwargs(types))
    if cache.calls != [1] * shape.layers:
        raise PrefixError(f"the prefix did not reach every layer exactly once (calls per layer: {cache.calls}); "
                          f"this transformers version no longer passes its cache to BERT self-attention "
                          f"in encoder mode: pin transformers to the tested 5.x or port encoder_prefix.py")
    return tuple(out.hidden_states)


def prefix_encode(model: nn.Module, prefix: Tensor | None, input_ids: Tensor, attention_mask: Tensor,
                  spec: LayerSpec = LayerSpec(), prefix_mask: Tensor | None = None,
                  token_type_ids: Tensor | None = None) -> Tensor:
    """`backbone.encode` with a prefix: token states (B, T, D) (or (B, T, D·n) for concat) of the
    layer(s) in `spec`."""
    return select_layers(prefix_hidden_states(model, prefix, input_ids, attention_mask, prefix_mask,
                                              token_type_ids), spec)


# ----------------------------------------------------------------------------- the classification method
class PrefixHead(Head):
    """Prefix-tuning of a frozen encoder for classification: per-layer key/value prefixes that
    every token attends to (the backbone runs live with them), then a linear layer on the
    mean-pooled states of the chosen layer. Only the prefix and the linear layer are trained; only
    the materialised prefix (no MLP) and the linear layer are saved."""

    steers_backbone = True  # the backbone runs live with this head's prefix in it (no cache)

    def __init__(self, cfg: PrefixConfig, dim: int, num_labels: int):
        super().__init__()
        self.cfg = cfg
        self.out = nn.Linear(dim, num_labels)
        self.prefix: PrefixEncoder | None = None  # built by init_from_backbone (needs the encoder's shape)

    def init_from_backbone(self, backbone: Any, labels: list[str]) -> None:
        _bert(backbone.model)  # refuse a non-BERT encoder now, not at the first batch
        shape = encoder_kv_shape(backbone.model.config)
        self.prefix = PrefixEncoder(self.cfg, shape, backbone.model.config.hidden_size)
        if self.cfg.init == "words":  # the encoder's own keys/values on init_text
            ids = phrase_ids(backbone.tok, self.cfg.init_text, self.cfg.prefix_length)
            self.prefix.init_from(encoder_activations(backbone.model, ids))

    def encode(self, backbone: Any, input_ids: Tensor, attention_mask: Tensor,
               token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T, D) states of the backbone's chosen layer(s) with this prefix in every layer."""
        assert self.prefix is not None, "init_from_backbone was not called"
        return prefix_encode(backbone.model, self.prefix(), input_ids, attention_mask, backbone.layers,
                             token_type_ids=token_type_ids)

    def forward(self, f: Features) -> Output:
        return Output(self.out(masked_mean(f.hidden, f.mask)))  # (B, C)

    def saved_state(self) -> dict[str, Tensor]:
        """What is saved: the materialised prefix (N, 2, H, P, E) and the linear layer."""
        assert self.prefix is not None
        return {"prefix.prefix": self.prefix.materialize(), **{f"out.{k}": v for k, v in self.out.state_dict().items()}}

    def prepare_load(self) -> None:
        """Hold the prefix as a plain parameter, the form `saved_state` writes (the MLP is gone)."""
        assert self.prefix is not None
        cfg = dataclasses.replace(self.cfg, reparam=False)
        self.prefix = PrefixEncoder(cfg, self.prefix.shape, 1)


register_method("prefix", PrefixConfig,
                "trainable key/value prefixes at every layer of the frozen model: a causal or encoder-decoder LM "
                "generating text (E2E, WebNLG, any source/target pairs), or an encoder with a linear head "
                "(classification)",
                train_defaults={"lr": 1e-3, "epochs": 5, "batch_size": 32, "patience": 2},
                generator=ByArchitecture(PrefixTuner, Seq2SeqPrefixTuner),
                # min_steps 0 in generation: the step floor was measured for classification heads (REPORT.md
                # "Few labels"); generation keeps the epoch budgets its E2E, WebNLG and SciTLDR runs measured
                generation_defaults={"lr": 3e-4, "epochs": 5, "batch_size": 8, "patience": 2, "eval_batch_size": 32,
                                     "min_steps": 0}
                )(PrefixHead)
