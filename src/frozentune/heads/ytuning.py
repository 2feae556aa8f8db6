"""Y-Tuning: learn label representations against a frozen model.

A task token and k vectors per class, Y = [e_T; e_1 … e_{C·k}] (N = 1 + C·k vectors), pass through L
decoder blocks: self-attention among the label vectors, cross-attention into the frozen token
states X (padding masked), a feed-forward layer; post-LayerNorm residuals. The label pointer
scores class c as s_c = h_T · h_c (h_c pools its k outputs); training uses cross-entropy over s
(default: better validation accuracy on SST-5 and TREC, bench/REPORT.md) or the paper's margin loss
L = Σ_{c≠c*} [s_c − s_{c*} + α]_+; prediction is argmax_c s_c.

Inference (eval, no autograd) never projects the tokens or forms their cross-attention keys and
values: P, W_k and W_v fold into the label side (folded_cross_attention), and block 1's self-attention
over the label vectors, which no input reaches, is made once from the weights (YTuningHead.folded).
The same scores and attention within float32 rounding (bench/ytuning_fold.py measures the speed).

Legend: B batch, T tokens, Dx backbone width, D label-encoder width, C classes, k vectors per
class, N = 1 + C·k label vectors, h attention heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..fields import as_flag
from ..head import (MANY_LABELS, Explanation, Features, Head, Output, TokenView, fewer_note, kept_from_weights,
                    lined_classes, shown)
from ..registry import MethodConfig, MethodError, changed, register_method


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
    dropout: float = field(default=0.1, metadata={"help": "dropout inside the label encoder", "fraction": True})

    def unused(self) -> list[tuple[list[str], str]]:
        return [(changed(self, "alpha") if self.loss == "ce" else [],
                 "is the margin loss's α: with --loss ce it is not used; add --loss margin, or leave it out"),
                (changed(self, "pool") if self.k == 1 else [],
                 "pools a label's k vectors: with --k 1 there is one to pool; add --k 2 or more, or leave it out")]

    def validate(self) -> None:
        for name in ("layers", "k", "heads", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"ytuning: {as_flag(name)} {getattr(self, name)}: must be at least 1")
        if self.dim < 0:
            raise ValueError(f"ytuning: --dim {self.dim}: use a width ≥ 1, or 0 for the backbone's width")
        if self.alpha < 0:  # max(0, α − s⁺ + s⁻) with α < 0 is zero once the right label scores a little below a wrong one
            raise ValueError(f"ytuning: --alpha {self.alpha}: the margin must be 0 or more")


def fold_keys_values(attn: nn.MultiheadAttention, proj: Tensor | None) -> tuple[Tensor, Tensor]:
    """The cross-attention's key and value maps with the input projection P folded in: (H, e, Dx)
    W_k,h·P and W_v,h·P, so that attention into the projected tokens P x_t can read the raw states
    x_t (P (D, Dx); None when the head reads the states at their own width)."""
    if not attn._qkv_same_embed_dim or attn.in_proj_bias is None or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError("folded_cross_attention needs attention with one q/k/v projection with biases, "
                         "no bias_kv and no zero attention")
    D, H = attn.embed_dim, attn.num_heads
    _, wk, wv = attn.in_proj_weight.split(D)  # (D, D) each
    wk, wv = wk.view(H, D // H, D), wv.view(H, D // H, D)  # (H, e, D)
    return (wk, wv) if proj is None else (wk @ proj, wv @ proj)  # (H, e, Dx)


def folded_queries(attn: nn.MultiheadAttention, y: Tensor, wk: Tensor) -> Tensor:
    """(B, N, D) label vectors → (B, N·H, Dx) each head's query mapped back through its key map:
    u = (W_k,h P)ᵀ q_h / √e, so that u · x_t is the head's score of token t (up to q_h·b_k,h, a shift
    of the whole row that the softmax ignores). wk (H, e, Dx) from fold_keys_values."""
    B, N, D = y.shape
    H = attn.num_heads
    e = D // H
    wq, bq = attn.in_proj_weight[:D], attn.in_proj_bias[:D]
    q = F.linear(y, wq, bq).view(B, N, H, e) * e ** -0.5  # (B, N, H, e)
    return torch.einsum("bnhe,hex->bnhx", q, wk).reshape(B, N * H, wk.shape[-1])


def folded_cross_attention(attn: nn.MultiheadAttention, u: Tensor, x: Tensor, pad: Tensor,
                           wv: Tensor) -> tuple[Tensor, Tensor]:
    """attn(y, P x, P x) of the N label vectors into the T tokens without the tokens' projection,
    keys or values: a score is u·x_t (folded_queries), and a head's value Σ_t a_t (W_v,h P x_t + b_v,h)
    is (W_v,h P)(Σ_t a_t x_t) + b_v,h (the weights a_t sum to 1). Per token 2·N·H·Dx products
    instead of D·Dx + 2·D² (N label vectors; D = 128, H = 4 at the defaults).
    u (B or 1, N·H, Dx): one u for the whole batch is one matrix product over all its tokens;
    x (B, T, Dx) raw states, pad (B, T) True on padding, wv (H, e, Dx) from fold_keys_values →
    (B, N, D) output, (B, N, T) weights averaged over heads, as nn.MultiheadAttention(need_weights=True)
    returns them. No attention dropout: for eval."""
    B, T, Dx = x.shape
    H, e = wv.shape[:2]
    NH = u.shape[1]
    N = NH // H
    scores = F.linear(x, u[0]) if u.shape[0] == 1 else torch.bmm(x, u.transpose(1, 2))  # (B, T, N·H)
    a = scores.masked_fill(pad[..., None], float("-inf")).softmax(1)  # (B, T, N·H) over tokens
    ctx = torch.bmm(a.transpose(1, 2), x).view(B, N, H, Dx)  # (B, N, H, Dx) Σ_t a_t x_t
    bv = attn.in_proj_bias[2 * H * e:].view(H, e)
    v = torch.einsum("bnhx,hex->bnhe", ctx, wv) + bv  # (B, N, H, e)
    return attn.out_proj(v.reshape(B, N, H * e)), a.view(B, T, N, H).mean(3).transpose(1, 2)


class LabelDecoderBlock(nn.Module):
    """Self-attention over labels, cross-attention into tokens, FFN; post-LN residuals."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn, d))
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def among_labels(self, y: Tensor) -> Tensor:
        """(B, N, D) → (B, N, D): the self-attention over the label vectors and its residual."""
        return self.n1(y + self.drop(self.self_attn(y, y, y, need_weights=False)[0]))

    def finish(self, y: Tensor, a: Tensor) -> Tensor:
        """(B, N, D) label vectors, (B, N, D) their cross-attention output → the block's output."""
        y = self.n2(y + self.drop(a))
        return self.n3(y + self.drop(self.ffn(y)))

    def forward(self, y: Tensor, x: Tensor, pad: Tensor) -> tuple[Tensor, Tensor]:
        """y (B, N, D), x (B, T, D) projected states, pad (B, T) True on padding → y (B, N, D), attn (B, N, T)."""
        y = self.among_labels(y)
        a, w = self.cross_attn(y, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=True)
        return self.finish(y, a), w


class Folded(NamedTuple):
    """What inference precomputes from the weights alone (YTuningHead.folded)."""
    first: Tensor  # (1, N, D) the label vectors after block 1's self-attention: no input reaches them
    u_first: Tensor  # (1, N·H, Dx) block 1's folded queries (folded_queries)
    wk: list[Tensor]  # per block, (H, e, Dx) W_k,h P
    wv: list[Tensor]  # per block, (H, e, Dx) W_v,h P


# where a factorised embedding's vectors (embedding_size wide) are mapped to the hidden width
EMBEDDING_PROJECTIONS = ("embeddings_project",  # ELECTRA (model.embeddings_project)
                         "encoder.embedding_hidden_mapping_in")  # ALBERT


def embedding_rows(backbone, width: int) -> Tensor:
    """(V, width) input embedding vectors of the backbone's vocabulary at the width of the states a
    head reads: the embedding table as is where it is that wide; else through the model's embedding →
    hidden projection (EMBEDDING_PROJECTIONS; applied to the word vectors alone, without the position
    and type embeddings and LayerNorm that precede it in the model's own pass); then repeated where
    `width` is several layers concatenated. A MethodError, saying to use --init uniform, otherwise."""
    model = backbone.model
    emb = model.get_input_embeddings().weight.detach()  # (V, E)
    hidden = getattr(model.config, "hidden_size", emb.shape[1])
    if emb.shape[1] != hidden:
        found = (_submodule(model, p) for p in EMBEDDING_PROJECTIONS)
        proj = next((m for m in found if isinstance(m, nn.Linear) and m.in_features == emb.shape[1]
                     and m.out_features == hidden), None)
        if proj is None:
            raise MethodError(f"ytuning: {backbone.name!r} has {emb.shape[1]}-wide input embeddings but {hidden}-wide "
                              f"states, and no embedding projection this knows; give --init uniform")
        with torch.no_grad():
            emb = proj(emb)  # (V, hidden)
    if width % emb.shape[1]:
        raise MethodError(f"ytuning: the states read are {width} wide, not a multiple of the {emb.shape[1]}-wide "
                          f"embeddings; give --init uniform")
    return emb.repeat(1, width // emb.shape[1])  # (V, width)


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


class YTuningHead(Head):
    """Y-Tuning label encoder + label pointer over frozen token states."""

    # where the folds kept the head on development rows, the mean of its fold models gained 5.1 points over the
    # refit alone (17 runs, 16 won; bench/soup_dev.py, bench/REPORT.md)
    average_folds = True

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


    def cost_note(self) -> str | None:
        if self.C < MANY_LABELS:
            return None
        return (f"ytuning: {self.C} labels: the label decoder attends from every label to every other for each text, "
                f"so a step costs more than in proportion to the labels (about with their square at hundreds; README, "
                f"\"Many classes\"); probe and selfexplain cost the same at any number of labels")
    def init_from_backbone(self, backbone, label_names: list[str]) -> None:
        """Label vectors from the backbone's input embeddings (mean over a name's word pieces; the unknown
        token's for a name of none: an IndexError ended training or a relabelled model's load), projected to D;
        the task token from the [CLS]/first special token. Called at creation.
        The vectors are taken at the width of the states the head reads (`embedding_rows`): a
        factorised embedding (ELECTRA, ALBERT: embedding_size < hidden_size) is passed through the
        model's own embedding → hidden projection, and layers read concatenated get the vector once
        per layer."""
        if self.cfg.init == "uniform":
            return
        emb = embedding_rows(backbone, self.proj.in_features if isinstance(self.proj, nn.Linear)
                             else self.labels.shape[1])  # (V, Dx)
        g = torch.Generator().manual_seed(0)
        if self.cfg.init == "label_names":  # a name of no word pieces (a lone accent, which BERT's tokenizer strips)
            unk = backbone.tok.unk_token_id if backbone.tok.unk_token_id is not None else backbone.pad_id()
            ids = [backbone.tok(name, add_special_tokens=False)["input_ids"] or [unk] for name in label_names]
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
        if self.training or torch.is_grad_enabled():
            x = self.proj(f.hidden)  # (B, T, D)
            y = self.labels.unsqueeze(0).expand(x.shape[0], -1, -1)  # (B, N, D)
            for block in self.blocks:
                y, attn = block(y, x, ~f.mask)
        else:  # inference: no projection, keys or values of the tokens; block 1's label side made once
            y, attn = self.infer_labels(f)
        h_task = y[:, 0]  # (B, D)
        h_lab = y[:, 1:].reshape(y.shape[0], self.C, self.cfg.k, -1)  # (B, C, k, D)
        h_lab = h_lab.mean(2) if self.cfg.pool == "mean" else h_lab.amax(2)  # (B, C, D)
        scores = torch.einsum("bd,bcd->bc", h_task, h_lab)  # (B, C)
        # explanation: each label's last-layer cross-attention over tokens (mean over its k vectors)
        label_attn = attn[:, 1:].reshape(attn.shape[0], self.C, self.cfg.k, -1).mean(2)  # (B, C, T)
        return Output(scores, {"label_attention": label_attn})

    def infer_labels(self, f: Features) -> tuple[Tensor, Tensor]:
        """Eval without autograd: the label encoder read against the raw states, the same sums as the
        training path within float32 rounding. The projection P and the cross-attention's key and value
        maps fold into the label side (folded_cross_attention), and block 1's self-attention and queries,
        which no input reaches, come from `folded`. → y (B, N, D), last block's attention (B, N, T)."""
        w = self.folded()
        x, pad = f.hidden, ~f.mask  # (B, T, Dx), (B, T)
        y = w.first.expand(x.shape[0], -1, -1)  # (B, N, D)
        for n, block in enumerate(self.blocks):
            if n == 0:
                u = w.u_first  # (1, N·H, Dx) one for the whole batch
            else:
                y = block.among_labels(y)
                u = folded_queries(block.cross_attn, y, w.wk[n])  # (B, N·H, Dx)
            a, attn = folded_cross_attention(block.cross_attn, u, x, pad, w.wv[n])
            y = block.finish(y, a)
        return y, attn

    def folded(self) -> Folded:
        """The weight-only part of inference (Folded), kept until a parameter is replaced or changed in
        place (head.kept_from_weights)."""
        return kept_from_weights(self, "_folded", self._fold)

    def _fold(self) -> Folded:
        proj = self.proj.weight if isinstance(self.proj, nn.Linear) else None  # (D, Dx)
        wk, wv = zip(*(fold_keys_values(b.cross_attn, proj) for b in self.blocks))
        first = self.blocks[0].among_labels(self.labels[None])  # (1, N, D)
        return Folded(first, folded_queries(self.blocks[0].cross_attn, first, wk[0]), list(wk), list(wv))

    def explain(self, out: Output, tokens: TokenView, labels: list[str], top: int) -> Explanation:
        """What the labels attend to, which is not what the prediction needs (ATTENTION_NOTE).

        Per label, the text's tokens its last-layer cross-attention weighted most ({text, start,
        end, weight}: the token's word and its character range [start, end) in the text; weight: the
        attention itself, not renormalised; a word of several pieces is listed once, with its most
        attended piece's weight), and under `special_tokens` the share of the label's
        attention on [CLS], [SEP] and the like. Those carry much of it (0.20-0.55 of the predicted label's
        attention on 80% of TREC's test questions, MiniLM with the defaults) and say nothing about the
        text, so they are not ranked."""
        attn = out.extras["label_attention"][0, :, :len(tokens.pieces)]  # (C, T)
        real = tokens.text_pieces()
        special = 1.0 - attn[:, real].sum(-1)  # (C,) the softmax over tokens sums to 1
        per_label, shares = {}, {}
        for c, lab in enumerate(labels):
            w, j = attn[c, real].sort(descending=True)
            per_label[lab] = tokens.ranked(((real[int(t)], real[int(t)], float(v)) for v, t in zip(w, j)), top)
            shares[lab] = round(max(float(special[c]), 0.0), 4)
        lined, left_out = lined_classes(out.logits[0], labels)
        lines = [f"{labels[c]:>14}: " + "  ".join(f"{shown(t)} {t['weight']:.2f}" for t in per_label[labels[c]])
                 + f"   (special tokens {shares[labels[c]]:.2f})" for c in lined] + left_out
        lines += fewer_note(min(len(t) for t in per_label.values()), top, "the text has no more words")
        lines.append(ATTENTION_NOTE)
        return Explanation({"attention": per_label, "special_tokens": shares}, lines)

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        if self.cfg.loss == "ce":
            return F.cross_entropy(out.logits, labels)
        return margin_loss(out.logits, labels, self.cfg.alpha)


# Measured (bench/faithfulness.py, SST-5 test, 300 sentences, bench/REPORT.md "How faithful the explanations
# are"): cutting out the words the predicted label attends to most lowered its probability less than cutting
# out random words, where occlusion's words lowered it most. The lines say so beside the attention.
ATTENTION_NOTE = ("(attention, not importance: on SST-5, cutting out the most attended words took less from the "
                  "predictions than cutting out random ones; `frozentune explain --occlusion` measures what this one needs)")


def margin_loss(scores: Tensor, labels: Tensor, alpha: float) -> Tensor:
    """Σ_{c≠c*} [s_c − s_{c*} + α]_+, averaged over the batch. scores (B, C), labels (B,)."""
    true = scores.gather(1, labels[:, None])  # (B, 1)
    hinge = (scores - true + alpha).clamp_min(0.0)  # (B, C)
    hinge = hinge.masked_fill(F.one_hot(labels, scores.shape[1]).bool(), 0.0)
    return hinge.sum(1).mean()


register_method("ytuning", YTuningConfig, "Y-Tuning: label representations learned against frozen token states",
                train_defaults={"lr": 1e-3, "epochs": 20, "batch_size": 32, "patience": 5})(YTuningHead)
