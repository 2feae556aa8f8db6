"""Slow reference forwards of BART and T5 written from their weights (state_dict tensors and the
config), with prefix keys/values prepended in all three attention kinds: Li & Liang's
z = [PREFIX; x] (encoder) and [PREFIX'; y] (decoder self-attention), plus the cross-attention
prefix. Nothing here calls a module's forward; the tests hold frozentune's prefixed forward
(which goes through transformers' own BART/T5 code) against these.

prefixes: {kind: (N, 2, H, P, E)} for kind in encoder / decoder / cross (the same on every row).
Returns decoder logits (B, T, V) and the per-layer hidden states of encoder and decoder.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

NEG = -1e30


def _heads(x: Tensor, h: int) -> Tensor:          # (B, T, H·E) → (B, H, T, E)
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def _attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, prefix: Tensor | None, scale: float,
            bias: Tensor | None = None) -> Tensor:
    """q (B, H, Q, E), k/v (B, H, S, E), allowed (B, Q, S) bool, prefix (2, H, P, E) or None,
    bias (H, Q, S) added to real keys only → (B, Q, H·E)."""
    scores = q @ k.transpose(-1, -2) * scale                      # (B, H, Q, S)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed[:, None], NEG)
    if prefix is not None and prefix.shape[2]:
        pk, pv = prefix[0].expand(q.shape[0], -1, -1, -1), prefix[1].expand(q.shape[0], -1, -1, -1)
        scores = torch.cat([q @ pk.transpose(-1, -2) * scale, scores], -1)
        v = torch.cat([pv, v], 2)
    out = scores.softmax(-1) @ v                                  # (B, H, Q, E)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _lin(w: dict, name: str, x: Tensor) -> Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def _ln(w: dict, name: str, x: Tensor, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], eps)


# ----------------------------------------------------------------------------- BART
def bart(model, prefixes: dict[str, Tensor], ids: Tensor, mask: Tensor, dec: Tensor):
    cfg, w = model.config, {k: v.detach() for k, v in model.state_dict().items()}
    h, e = cfg.encoder_attention_heads, cfg.d_model // cfg.encoder_attention_heads
    scale, eps = e ** -0.5, 1e-5
    emb_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
    act = {"gelu": lambda x: F.gelu(x), "relu": F.relu}[cfg.activation_function]
    keep = mask.bool()

    def attn(pre: str, x: Tensor, src: Tensor, allowed: Tensor, prefix) -> Tensor:
        q, k, v = (_heads(_lin(w, f"{pre}.{n}_proj", t), h) for n, t in (("q", x), ("k", src), ("v", src)))
        return _lin(w, f"{pre}.out_proj", _attend(q, k, v, allowed, prefix, scale))

    def ffn(pre: str, x: Tensor) -> Tensor:
        return _lin(w, f"{pre}.fc2", act(_lin(w, f"{pre}.fc1", x)))

    def embed(side: str, tokens: Tensor) -> Tensor:
        pos = torch.arange(tokens.shape[1]) + 2                   # BART's learned positions start at offset 2
        x = w["model.shared.weight"][tokens] * emb_scale + w[f"model.{side}.embed_positions.weight"][pos]
        return _ln(w, f"model.{side}.layernorm_embedding", x, eps)

    x, enc_states = embed("encoder", ids), []
    enc_allowed = keep[:, None, :].expand(-1, ids.shape[1], -1)
    for n in range(cfg.encoder_layers):
        p = f"model.encoder.layers.{n}"
        x = _ln(w, f"{p}.self_attn_layer_norm", x + attn(f"{p}.self_attn", x, x, enc_allowed, prefixes["encoder"][n]), eps)
        x = _ln(w, f"{p}.final_layer_norm", x + ffn(p, x), eps)
        enc_states.append(x)
    y, dec_states, t = embed("decoder", dec), [], dec.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None].expand(dec.shape[0], -1, -1)
    cross_allowed = keep[:, None, :].expand(-1, t, -1)
    for n in range(cfg.decoder_layers):
        p = f"model.decoder.layers.{n}"
        y = _ln(w, f"{p}.self_attn_layer_norm", y + attn(f"{p}.self_attn", y, y, causal, prefixes["decoder"][n]), eps)
        y = _ln(w, f"{p}.encoder_attn_layer_norm",
                y + attn(f"{p}.encoder_attn", y, x, cross_allowed, prefixes["cross"][n]), eps)
        y = _ln(w, f"{p}.final_layer_norm", y + ffn(p, y), eps)
        dec_states.append(y)
    logits = y @ w["model.shared.weight"].T + w["final_logits_bias"]
    return logits, enc_states, dec_states


# ----------------------------------------------------------------------------- T5
def _bucket(relative: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's relative-position bucket (Raffel et al. 2020): exact below buckets/2 (per direction), log-spaced above."""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out += (relative > 0).long() * buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    exact = buckets // 2
    large = exact + (torch.log(relative.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return out + torch.where(relative < exact, relative, large)


def t5(model, prefixes: dict[str, Tensor], ids: Tensor, mask: Tensor, dec: Tensor):
    cfg, w = model.config, {k: v.detach() for k, v in model.state_dict().items()}
    h, eps = cfg.num_heads, cfg.layer_norm_epsilon
    keep = mask.bool()

    def rms(name: str, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name + ".weight"]

    def attn(pre: str, x: Tensor, src: Tensor, allowed: Tensor, prefix, bias) -> Tensor:
        q, k, v = (_heads(_lin(w, f"{pre}.{n}", t), h) for n, t in (("q", x), ("k", src), ("v", src)))
        return _lin(w, f"{pre}.o", _attend(q, k, v, allowed, prefix, 1.0, bias))   # T5: no 1/√E

    def ffn(pre: str, x: Tensor) -> Tensor:
        return _lin(w, f"{pre}.wo", F.relu(_lin(w, f"{pre}.wi", x)))

    def rel_bias(side: str, q: int, k: int, bidirectional: bool) -> Tensor:
        rel = torch.arange(k)[None, :] - torch.arange(q)[:, None]
        b = _bucket(rel, bidirectional, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
        table = w[f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]   # (buckets, H)
        return table[b].permute(2, 0, 1)                                                    # (H, Q, K)

    s, t = ids.shape[1], dec.shape[1]
    x, enc_states = w["shared.weight"][ids], []
    enc_bias = rel_bias("encoder", s, s, True)
    enc_allowed = keep[:, None, :].expand(-1, s, -1)
    for n in range(cfg.num_layers):
        p = f"encoder.block.{n}.layer"
        x = x + attn(f"{p}.0.SelfAttention", rms(f"{p}.0.layer_norm", x), rms(f"{p}.0.layer_norm", x),
                     enc_allowed, prefixes["encoder"][n], enc_bias)
        x = x + ffn(f"{p}.1.DenseReluDense", rms(f"{p}.1.layer_norm", x))
        enc_states.append(x)
    x = rms("encoder.final_layer_norm", x)
    y, dec_states = w["shared.weight"][dec], []
    dec_bias = rel_bias("decoder", t, t, False)
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None].expand(dec.shape[0], -1, -1)
    cross_allowed = keep[:, None, :].expand(-1, t, -1)
    for n in range(cfg.num_decoder_layers):
        p = f"decoder.block.{n}.layer"
        z = rms(f"{p}.0.layer_norm", y)
        y = y + attn(f"{p}.0.SelfAttention", z, z, causal, prefixes["decoder"][n], dec_bias)
        y = y + attn(f"{p}.1.EncDecAttention", rms(f"{p}.1.layer_norm", y), x, cross_allowed, prefixes["cross"][n], None)
        y = y + ffn(f"{p}.2.DenseReluDense", rms(f"{p}.2.layer_norm", y))
        dec_states.append(y)
    y = rms("decoder.final_layer_norm", y)
    if cfg.tie_word_embeddings:
        y = y * cfg.d_model ** -0.5
    logits = y @ w["lm_head.weight"].T
    return logits, enc_states, dec_states
