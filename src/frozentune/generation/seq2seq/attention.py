"""Where a prefix enters an encoder-decoder LM: one attention function, registered with
transformers' attention interface, that every attention call of the model goes through.

Legend: B rows, Hq query heads, H key/value heads, Q queries, S keys, P prefix slots, E head dim.

Why an attention function and not a cache. A causal LM takes a prefix as a pre-filled cache
(prefix.py); an encoder-decoder LM cannot: its encoder takes no cache at all, and its cross-
attention cache is filled from the encoder's output on the first decoding step, so a prefix
placed there would be overwritten or skipped depending on the cache class's `is_updated` flags
(the place where PEFT's seq2seq prefix-tuning has broken as those classes changed). Here the
prefix never enters a cache: each attention call prepends the prefix keys/values of its own
site to whatever keys/values the model computed or cached, and widens the mask by the prefix's
slots. The caches hold real tokens only, so `generate`, beam reordering and cache classes are
untouched, and the prefix has no position (BART's learned positions and T5's relative bias are
those of the real tokens; T5's bias is 0 on prefix slots).

Sites. `find_sites` runs the model once on a 3-token source and a 2-token target and records
every attention call: calls inside the encoder are encoder self-attention, decoder calls whose
keys have the source's length are cross-attention, the rest decoder self-attention. Nothing is
assumed about module names (BART's `self_attn` / `encoder_attn`, T5's `SelfAttention` /
`EncDecAttention`), and a model whose attention does not go through the interface is refused.

With no prefix set on a module the function is plain scaled dot-product attention with the
model's mask (and T5's position bias), so the LM behaves as before (tests hold it against the
model with its default attention).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from ...errors import FrozentuneError

ATTN = "frozentune_prefix"   # the name the function is registered under
KINDS = ("encoder", "decoder", "cross")
_ATTR = "_frozentune_prefix"  # on an attention module while a prefix is set: (keys, values, keep)
_RECORD: list | None = None   # while find_sites / record runs: calls are appended here
_LOCK = threading.RLock()     # prefixes live on modules: one prefixed call at a time per process


class Seq2SeqError(FrozentuneError, ValueError):
    """An encoder-decoder model or prefix that cannot work here; says what to do."""


def register() -> None:
    """Register the attention function and its mask builder (transformers' eager float masks) once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    if ATTN not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN, prefixed_attention)
        AttentionMaskInterface.register(ATTN, eager_mask)


def use_prefix_attention(lm: nn.Module) -> None:
    """Route every attention call of `lm` through `prefixed_attention` (plain attention when no prefix is set)."""
    register()
    if hasattr(lm, "set_attn_implementation"):
        lm.set_attn_implementation(ATTN)
    else:  # pragma: no cover - older transformers
        lm.config._attn_implementation = ATTN
    if lm.config._attn_implementation != ATTN:
        raise Seq2SeqError(f"{type(lm).__name__}: could not switch its attention to frozentune's prefix attention")


def _float_mask(mask: Tensor | None, module: nn.Module, q: int, s: int, dtype: torch.dtype,
                device: torch.device) -> Tensor | None:
    """The model's mask as an additive float mask (…, Q, S), or None when every key is allowed."""
    if mask is not None:
        if mask.dtype == torch.bool:
            return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask.to(dtype)
    if getattr(module, "is_causal", False) and q > 1:  # no mask given: causal, queries are the last q of s keys
        allowed = torch.ones(q, s, dtype=torch.bool, device=device).tril(s - q)
        return torch.zeros(q, s, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return None


def prefixed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       scaling: float | None = None, dropout: float = 0.0, position_bias: Tensor | None = None,
                       **kwargs) -> tuple[Tensor, None]:
    """Attention of query (B, Hq, Q, E) over [prefix; key] (B, H, P+S, E) → (B, Q, Hq, E).
    attention_mask (B|1, 1, Q, S) additive (or bool, or None); position_bias (T5) (B|1, H, Q, S)."""
    if _RECORD is not None:
        _RECORD.append((module, query.shape[2], key, value))
    b, _, q, _ = query.shape
    s = key.shape[2]
    bias = _float_mask(attention_mask, module, q, s, query.dtype, query.device)
    if position_bias is not None:
        bias = position_bias.to(query.dtype) if bias is None else bias + position_bias.to(query.dtype)
    prefix = getattr(module, _ATTR, None)
    if prefix is not None:
        pk, pv, keep = (_rows(t, b) for t in prefix)               # (B, H, P, E) ×2, (B, P)
        key = torch.cat([pk.to(key.dtype), key], 2)
        value = torch.cat([pv.to(value.dtype), value], 2)
        rest = torch.zeros(1, 1, q, s, dtype=query.dtype, device=query.device) if bias is None else bias
        heads = rest.shape[1] if rest.dim() == 4 else 1         # 1, or H with T5's per-head bias
        slots = torch.zeros(b, 1, q, keep.shape[1], dtype=query.dtype, device=query.device)
        slots = slots.masked_fill(~keep[:, None, None, :], torch.finfo(query.dtype).min)
        bias = torch.cat([slots.expand(b, heads, q, keep.shape[1]), rest.expand(b, heads, q, s)], -1)  # (B, ·, Q, P+S)
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key/value head serves several query heads
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _rows(t: Tensor, rows: int) -> Tensor:
    """A per-input tensor (B0, …) for `rows` = B0·k rows: generate expands each input k times in a row
    (beams), so row r uses input r // k."""
    if t.shape[0] == rows:
        return t
    if rows % t.shape[0]:
        raise Seq2SeqError(f"the prefix has {t.shape[0]} rows but the attention call has {rows}")
    return t.repeat_interleave(rows // t.shape[0], 0)


# ----------------------------------------------------------------------------- the model's attention sites
@dataclass(frozen=True)
class Site:
    """One attention module and what its keys hold: H key/value heads of E dims."""
    module: nn.Module
    heads: int
    head_dim: int


@contextlib.contextmanager
def record() -> Iterator[list]:
    """Collect (module, queries, keys (B, H, S, E), values) of every attention call inside the block."""
    global _RECORD
    with _LOCK:
        _RECORD = []
        try:
            yield _RECORD
        finally:
            _RECORD = None


@torch.no_grad()
def find_sites(lm: nn.Module) -> dict[str, list[Site]]:
    """{encoder, decoder, cross: [Site per layer]}, found by running `lm` once (see the module docstring)."""
    from ..prefix import architecture

    if architecture(lm) != "encoder-decoder":
        raise Seq2SeqError(f"{type(lm).__name__} is not an encoder-decoder model; a causal LM takes the "
                           f"decoder-only prefix (frozentune.generation.prefix.PrefixTuner)")
    use_prefix_attention(lm)
    device = next(lm.parameters()).device
    start = lm.config.decoder_start_token_id
    src = torch.ones(1, 3, dtype=torch.long, device=device)
    tgt = torch.full((1, 2), int(start if start is not None else 0), dtype=torch.long, device=device)
    encoder_modules = {id(m) for m in lm.get_encoder().modules()}
    with record() as calls:
        lm(input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=tgt, use_cache=False)
    sites: dict[str, list[Site]] = {k: [] for k in KINDS}
    for module, queries, key, _ in calls:
        kind = "encoder" if id(module) in encoder_modules else ("cross" if key.shape[2] == 3 and queries == 2 else "decoder")
        sites[kind].append(Site(module, int(key.shape[1]), int(key.shape[3])))
    if not sites["encoder"] or not sites["decoder"] or not sites["cross"]:
        raise Seq2SeqError(f"{type(lm).__name__}: found {', '.join(f'{len(v)} {k}' for k, v in sites.items())} "
                           f"attention calls through transformers' attention interface; prefix-tuning needs all "
                           f"three kinds (BART, T5 and models written like them)")
    for kind, found in sites.items():
        if len({(s.heads, s.head_dim) for s in found}) != 1:
            raise Seq2SeqError(f"{type(lm).__name__}: its {kind} attention layers differ in heads/head size; "
                               f"not supported by prefix-tuning here")
        if len({id(s.module) for s in found}) != len(found):
            raise Seq2SeqError(f"{type(lm).__name__}: one {kind} attention module is called twice per "
                               f"forward (shared layers); not supported by prefix-tuning here")
    return sites


@torch.no_grad()
def site_activations(lm: nn.Module, sites: dict[str, list[Site]], ids: Sequence[int]) -> dict[str, Tensor]:
    """The model's own keys/values on the tokens `ids` as source and as target: {kind: (N, 2, H, P, E)},
    P = len(ids) (the prefix init from real words)."""
    device = next(lm.parameters()).device
    x = torch.tensor([list(ids)], device=device)
    with record() as calls:
        lm(input_ids=x, attention_mask=torch.ones_like(x), decoder_input_ids=x, use_cache=False)
    by_module = {id(m): (k[0], v[0]) for m, _, k, v in calls}
    return {kind: torch.stack([torch.stack(by_module[id(s.module)]) for s in found]).float()
            for kind, found in sites.items()}


@contextlib.contextmanager
def prefixes_set(sites: dict[str, list[Site]], kv: dict[str, Tensor], keep: dict[str, Tensor]) -> Iterator[None]:
    """Inside the block, site n of each kind attends to kv[kind][n] ((2, B, H, P, E)) before its own
    keys, on the slots where keep[kind] ((B, P) bool) is True. Always cleared on exit."""
    with _LOCK:
        try:
            for kind, found in sites.items():
                for n, site in enumerate(found):
                    setattr(site.module, _ATTR, (kv[kind][n, 0], kv[kind][n, 1], keep[kind]))
            yield
        finally:
            for found in sites.values():
                for site in found:
                    if hasattr(site.module, _ATTR):
                        delattr(site.module, _ATTR)
