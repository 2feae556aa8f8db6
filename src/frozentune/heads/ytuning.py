"""Y-Tuning: learn label representations against a frozen model.

A task token and k vectors per class, Y = [e_T; e_1 … e_{C·k}] (N = 1 + C·k vectors), pass through L
decoder blocks: self-attention among the label vectors, cross-attention into the frozen token
states X (padding masked), a feed-forward layer; post-LayerNorm residuals. The label pointer
scores class c as s_c = h_T · h_c (h_c pools its k outputs); training uses cross-entropy over s
(default: better validation accuracy on SST-5 and TREC, bench/REPORT.md) or the paper's margin loss
L = Σ_{c≠c*} [s_c − s_{c*} + α]_+; prediction is argmax_c s_c.

Inference (eval, no autograd) never forms the tokens' cross-attention keys and values: W_k and W_v
fold into the label side (folded_cross_attention), the same scores and attention within float32
rounding; 1.3-1.9× faster than the training path (bench/ytuning_fold.py).

Legend: B batch, T tokens, Dx backbone width, D label-encoder width, C classes, k vectors per
class, N = 1 + C·k label vectors, h attention heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..head import Explanation, Features, Head, Output, TokenView
from ..registry import MethodConfig, register_method


@dataclass
class YTuningConfig(MethodConfig):
    layers: int = field(default=2, metadata={"help": "decoder blocks in the label encoder (L)"})
    dim: int = field(default=128, metadata={"help": "label-encoder width D (X is projected once); 0 = the backbone's width"})
    heads: int = field(default=4, metadata={"help": "attention heads (must divide D)"})
    k: int = field(default=1, metadata={"help": "vectors per label"})
    pool: str = field(default="mean", metadata={"help": "how a label's k outputs are pooled", "choices": ("mean", "max")})
    loss: str = field(default="ce", metadata={"help": "cross-entropy over the scores, or the paper's margin (triplet) loss", "choices": ("ce", "margin")})
    alpha: float = field(default=1.0, metadata={"help": "margin α of the margin loss (used with --loss margin)"})
    init: str = field(default="label_names", metadata={
        "help": "label embedding initialisation: the backbone's input embeddings of the label names' tokens, "
                "of random vocabulary tokens, or uniform random", "choices": ("label_names", "random_vocab", "uniform")})
    ffn_mult: int = field(default=2, metadata={"help": "feed-forward width as a multiple of D"})
    dropout: float = field(default=0.1, metadata={"help": "dropout inside the label encoder"})

    def validate(self) -> None:
        if self.layers < 1 or self.k < 1 or self.heads < 1:
            raise ValueError("ytuning: layers, k and heads must be at least 1")


def folded_cross_attention(attn: nn.MultiheadAttention, y: Tensor, x: Tensor, pad: Tensor) -> tuple[Tensor, Tensor]:
    """attn(y, x, x) of the N label vectors into the T tokens without the tokens' keys and values: a
    key's score q_h·(W_k,h x_t + b_k,h) is (W_k,hᵀ q_h)·x_t plus q_h·b_k,h, a shift of the whole row
    that the softmax ignores; a head's value Σ_t a_t (W_v,h x_t + b_v,h) is W_v,h (Σ_t a_t x_t) + b_v,h
    (the weights a_t sum to 1). Per token 2·N·D products instead of 2·D² (N label vectors against
    D = 128 at the defaults). y (B, N, D), x (B, T, D), pad (B, T) True on padding → (B, N, D) output,
    (B, N, T) weights averaged over heads, as nn.MultiheadAttention(need_weights=True) returns them.
    No attention dropout: for eval."""
    if not attn._qkv_same_embed_dim or attn.in_proj_bias is None or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError("folded_cross_attention needs attention with one q/k/v projection with biases, "
                         "no bias_kv and no zero attention")
    B, N, D = y.shape
    H = attn.num_heads
    e = D // H
    wq, wk, wv = attn.in_proj_weight.split(D)  # (D, D) each
    bq, _, bv = attn.in_proj_bias.split(D)  # the key bias shifts a whole row of scores: dropped
    q = F.linear(y, wq, bq).view(B, N, H, e) * e ** -0.5  # (B, N, H, e)
    u = torch.einsum("bnhe,hed->bnhd", q, wk.view(H, e, D)).reshape(B, N * H, D)  # (B, N·H, D) W_k,hᵀ q_h
    scores = torch.bmm(u, x.transpose(1, 2))  # (B, N·H, T)
    a = scores.masked_fill(pad[:, None], float("-inf")).softmax(-1)  # (B, N·H, T)
    ctx = torch.bmm(a, x).view(B, N, H, D)  # (B, N, H, D) Σ_t a_t x_t
    v = torch.einsum("bnhd,hed->bnhe", ctx, wv.view(H, e, D)) + bv.view(H, e)  # (B, N, H, e)
    return attn.out_proj(v.reshape(B, N, D)), a.view(B, N, H, -1).mean(2)


class LabelDecoderBlock(nn.Module):
    """Self-attention over labels, cross-attention into tokens, FFN; post-LN residuals."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn, d))
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def forward(self, y: Tensor, x: Tensor, pad: Tensor, fold: bool = False) -> tuple[Tensor, Tensor]:
        """y (B, N, D), x (B, T, D), pad (B, T) True on padding → y (B, N, D), attn (B, N, T). fold: the
        cross-attention without the tokens' keys and values (folded_cross_attention; eval only)."""
        y = self.n1(y + self.drop(self.self_attn(y, y, y, need_weights=False)[0]))
        if fold:
            a, w = folded_cross_attention(self.cross_attn, y, x, pad)
        else:
            a, w = self.cross_attn(y, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=True)
        y = self.n2(y + self.drop(a))
        y = self.n3(y + self.drop(self.ffn(y)))
        return y, w


class YTuningHead(Head):
    """Y-Tuning label encoder + label pointer over frozen token states."""

    def __init__(self, cfg: YTuningConfig, dim: int, num_labels: int):
        super().__init__()
        self.cfg, self.C = cfg, num_labels
        d = cfg.dim or dim
        if d % cfg.heads:
            raise ValueError(f"ytuning: dim {d} is not divisible by heads {cfg.heads}")
        self.proj = nn.Linear(dim, d, bias=False) if d != dim else nn.Identity()  # X → D, once
        self.labels = nn.Parameter(torch.empty(1 + num_labels * cfg.k, d).uniform_(-0.1, 0.1))  # (N, D)
        self.blocks = nn.ModuleList(LabelDecoderBlock(d, cfg.heads, cfg.ffn_mult * d, cfg.dropout)
                                    for _ in range(cfg.layers))

    def init_from_backbone(self, backbone, label_names: list[str]) -> None:
        """Label vectors from the backbone's input embeddings (mean over a name's word pieces),
        projected to D; the task token from the [CLS]/first special token. Called at creation."""
        if self.cfg.init == "uniform":
            return
        emb = backbone.model.get_input_embeddings().weight.detach()  # (V, Dx)
        g = torch.Generator().manual_seed(0)
        if self.cfg.init == "label_names":
            ids = [backbone.tok(name, add_special_tokens=False)["input_ids"] for name in label_names]
        else:  # random vocabulary tokens
            ids = [[int(torch.randint(1000, emb.shape[0], (1,), generator=g))] for _ in label_names]
        vecs = torch.stack([emb[torch.tensor(i)].mean(0) for i in ids])  # (C, Dx)
        cls = backbone.tok.cls_token_id if backbone.tok.cls_token_id is not None else backbone.pad_id()
        task = emb[cls][None]  # (1, Dx)
        with torch.no_grad():
            init = self.proj(torch.cat([task, vecs.repeat_interleave(self.cfg.k, 0)]))  # (N, D)
            init = init / init.std() * self.labels.std()  # keep the scale of the uniform init
            noise = 0.01 * torch.randn(init.shape, generator=g) * (self.cfg.k > 1)
            self.labels.copy_(init + noise)

    def forward(self, f: Features) -> Output:
        x = self.proj(f.hidden)  # (B, T, D)
        pad = ~f.mask  # (B, T)
        fold = not (self.training or torch.is_grad_enabled())  # inference: no keys or values of the tokens
        y = self.labels.unsqueeze(0).expand(x.shape[0], -1, -1)  # (B, N, D)
        for block in self.blocks:
            y, attn = block(y, x, pad, fold)
        h_task = y[:, 0]  # (B, D)
        h_lab = y[:, 1:].reshape(y.shape[0], self.C, self.cfg.k, -1)  # (B, C, k, D)
        h_lab = h_lab.mean(2) if self.cfg.pool == "mean" else h_lab.amax(2)  # (B, C, D)
        scores = torch.einsum("bd,bcd->bc", h_task, h_lab)  # (B, C)
        # explanation: each label's last-layer cross-attention over tokens (mean over its k vectors)
        label_attn = attn[:, 1:].reshape(attn.shape[0], self.C, self.cfg.k, -1).mean(2)  # (B, C, T)
        return Output(scores, {"label_attention": label_attn})

    def explain(self, out: Output, tokens: TokenView, labels: list[str], top: int) -> Explanation:
        """Per label, the text's tokens its last-layer cross-attention weighted most ({text, start,
        end, weight}: the token's word and its character range [start, end) in the text; weight: the
        attention itself, not renormalised), and under `special_tokens` the share of the label's
        attention on [CLS], [SEP] and the like. Those carry much of it (0.20-0.55 of the predicted label's
        attention on 80% of TREC's test questions, MiniLM with the defaults) and say nothing about the
        text, so they are not ranked."""
        attn = out.extras["label_attention"][0, :, :len(tokens.pieces)]  # (C, T)
        real = tokens.text_pieces()
        special = 1.0 - attn[:, real].sum(-1)  # (C,) the softmax over tokens sums to 1
        per_label, shares, lines = {}, {}, []
        for c, lab in enumerate(labels):
            w, j = attn[c, real].topk(min(top, len(real)))
            per_label[lab] = [tokens.weighted(real[int(t)], float(v)) for v, t in zip(w, j)]
            shares[lab] = round(max(float(special[c]), 0.0), 4)
            lines.append(f"{lab:>14}: " + "  ".join(f"{t['text']} {t['weight']:.2f}" for t in per_label[lab])
                         + f"   (special tokens {shares[lab]:.2f})")
        return Explanation({"attention": per_label, "special_tokens": shares}, lines)

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        if self.cfg.loss == "ce":
            return F.cross_entropy(out.logits, labels)
        return margin_loss(out.logits, labels, self.cfg.alpha)


def margin_loss(scores: Tensor, labels: Tensor, alpha: float) -> Tensor:
    """Σ_{c≠c*} [s_c − s_{c*} + α]_+, averaged over the batch. scores (B, C), labels (B,)."""
    true = scores.gather(1, labels[:, None])  # (B, 1)
    hinge = (scores - true + alpha).clamp_min(0.0)  # (B, C)
    hinge = hinge.masked_fill(F.one_hot(labels, scores.shape[1]).bool(), 0.0)
    return hinge.sum(1).mean()


register_method("ytuning", YTuningConfig, "Y-Tuning: label representations learned against frozen token states",
                train_defaults={"lr": 1e-3, "epochs": 20, "batch_size": 32, "patience": 5})(YTuningHead)
