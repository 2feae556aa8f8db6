"""The packed frozen pass: every linear layer runs on the real tokens only, none on padding.

A batch of texts is padded to its longest text, and a Hugging Face encoder computes every padded
position through every layer, then throws it away. Where batches are length-sorted (cache
building, `iter_states`) little is wasted. Where they are not, as in a server whose batch is
whatever requests arrived together, about 40% of the work is padding: 16 SST-2 test sentences
drawn at random fill 57% of their padded (16 × longest) slots (MiniLM's tokenizer, mean over 500
draws), IMDB reviews cut at 128 tokens 97%.

Here the embeddings are computed on the padded batch (as the model does: positions and token types
are per slot), then the real tokens are packed into one (N, D) matrix. Each layer's query, key and
value projections, its output projection, LayerNorms and feed-forward run on those N rows. Only
attention needs the batch's shape: q, k and v are scattered back into (B, heads, T, head_dim) for
one masked scaled-dot-product attention, and its output is gathered again. That is the same
arithmetic, row for row, as the model's own forward with its "sdpa" attention (a model set to
"eager" attention computes the same softmax along another kernel path: equal within rounding).
Text-embeddings-inference does the same on GPUs with variable-length attention kernels.

Measured (`OMP_NUM_THREADS=1 python bench/packed_pass.py`: MiniLM, 1 thread, 30 batches of 16 texts
in arrival order, padded as the server pads, best of 5 interleaved): on SST-2 sentences (54% of the
slots real) 1.58× the padded forward in fp32, 1.50× in bf16, 1.39× in int8; on IMDB at 128 tokens
(97% real) 0.96-1.07×, as good as nothing to skip. The states were bit-identical on that CPU.

Which models: BERT-style encoders whose layers are `attention.self` (query, key, value) →
`attention.output` → `intermediate` → `output`, without cross-attention or a causal mask: the
model types in `LAYOUTS` (BERT, which MiniLM is, and RoBERTa). Any other model is run padded, by
its own forward, and `packing_reason` says why, for the caller to report.

Padding positions of the returned states are 0 (the model's own forward leaves values there that
nothing should read; every head masks them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .precision import AutocastModel

# config.model_type → the layer layout described above (checked on the modules too, see packing_reason)
LAYOUTS = ("bert", "roberta")
# The packed matrix is grown with zero rows to a multiple of this many, so that its shapes come in few
# sizes, as `--pad-multiple` does for padded batches: every new row count is a new shape for the matrix
# kernels' per-shape caches and for the allocator, and a server's memory grew with them (bench/REPORT.md,
# Serving: "The packed pass"). The extra rows go through the linear layers and LayerNorms (a zero row
# stays finite) and are dropped; at most ROWS − 1 of them.
ROWS = 64


def _inner(runner: nn.Module) -> nn.Module:
    """The Hugging Face model inside a prepared runner (AutocastModel wraps it; fp32 and int8 are the model)."""
    return runner.model if isinstance(runner, AutocastModel) else runner


def packing_reason(runner: nn.Module) -> str | None:
    """None when `runner` (a model or `prepare`'s result) can run packed; else why not, in words."""
    model = _inner(runner)
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in LAYOUTS:
        return f"model type {kind!r} is not one of the BERT-style layouts it supports ({', '.join(LAYOUTS)})"
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
        return "the model is configured as a decoder (causal mask or cross-attention)"
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not layers or not hasattr(model, "embeddings"):
        return "the model has no embeddings + encoder.layer modules"
    for layer in layers:
        sa = getattr(getattr(layer, "attention", None), "self", None)
        parts = [getattr(sa, n, None) for n in ("query", "key", "value", "num_attention_heads", "attention_head_size",
                                                 "scaling")]
        if any(p is None for p in parts) or not all(hasattr(layer, n) for n in ("intermediate", "output")):
            return f"layer {type(layer).__name__} does not have the attention.self / intermediate / output layout"
        if getattr(layer, "crossattention", None) is not None:
            return "its layers have cross-attention"
    return None


def _attention(sa: nn.Module, x: Tensor, keep: Tensor, slots: Tensor) -> Tensor:
    """(R, D) packed states (the N real tokens, then R − N filler rows) → (R, D) attention context of
    one layer's self-attention module `sa` (0 at the filler rows); keep (B, T) bool marks the real
    tokens, slots (N,) their flat (B·T) positions, row-major: where the N rows came from."""
    B, T = keep.shape
    H, dh = sa.num_attention_heads, sa.attention_head_size
    q, k, v = (_scatter(proj(x), slots, (B, T)).view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh)
               for proj in (sa.query, sa.key, sa.value))
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], scale=sa.scaling)  # (B, H, T, dh)
    return _gather(ctx.transpose(1, 2).reshape(B * T, H * dh), slots, len(x))  # (R, H·dh)


def _gather(x: Tensor, slots: Tensor, rows: int) -> Tensor:
    """(B·T, D) → (rows, D): the N rows at slots, then rows − N zero rows."""
    return F.pad(x.index_select(0, slots), (0, 0, 0, rows - len(slots)))


def _scatter(x: Tensor, slots: Tensor, shape: tuple[int, int]) -> Tensor:
    """(R, D) packed rows → (B, T, D): the first N rows at their slots, zeros at padding."""
    out = x.new_zeros(shape[0] * shape[1], x.shape[-1])
    return out.index_copy_(0, slots, x[:len(slots)]).view(*shape, x.shape[-1])


def _forward(model: nn.Module, input_ids: Tensor, keep: Tensor, token_type_ids: Tensor | None) -> tuple[Tensor, ...]:
    emb = model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)  # (B, T, D) as the model makes them
    slots = keep.flatten().nonzero().squeeze(1)  # (N,) flat positions of the real tokens, row-major: found once
    x = _gather(emb.flatten(0, 1), slots, -(-len(slots) // ROWS) * ROWS)  # (R, D) the real tokens and filler rows
    states = [emb.masked_fill(~keep[..., None], 0.0)]
    for layer in model.encoder.layer:
        att = layer.attention.output(_attention(layer.attention.self, x, keep, slots), x)  # dense, residual, LayerNorm
        x = layer.output(layer.intermediate(att), att)  # feed-forward, residual, LayerNorm
        states.append(_scatter(x, slots, keep.shape))
    return tuple(states)


def packed_hidden_states(runner: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                         token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
    """Every hidden state (embeddings, then one per layer), each (B, T, D), as `runner(...,
    output_hidden_states=True)` computes them at the real tokens, and 0 at padding. `runner` is a
    model or `prepare`'s result (autocast for bf16/fp16, Int8Linear layers for int8) that
    `packing_reason` accepts. No gradients. input_ids, attention_mask (1 = real), token_type_ids: (B, T)."""
    why = packing_reason(runner)
    if why is not None:
        raise ValueError(f"cannot run this model packed: {why}")
    keep = attention_mask.bool()
    model = _inner(runner)
    with torch.no_grad():
        if isinstance(runner, AutocastModel):
            with torch.autocast(device_type=runner.device_type, dtype=runner.dtype):
                return _forward(model, input_ids, keep, token_type_ids)
        return _forward(model, input_ids, keep, token_type_ids)

