"""Self-explaining span head (Sun et al. 2020, "Self-Explaining Structures Improve NLP Models").

Every span (i, j) of the frozen token states, i ≤ j, j − i < W, gets a representation
    h(i,j) = tanh(W₁ h_i + W₂ h_j + W₃ (h_j − h_i) + W₄ (h_i ⊙ h_j))      (the maps share one bias)
an interpretation layer scores it, a softmax over the input's valid spans gives α(i,j), and the
classifier reads only their weighted sum Ĥ = Σ α(i,j) h(i,j) → dropout → linear → logits. The α are
the explanation: the spans the prediction is built from.

Training minimises  loss = CE − λ · Σ_{i,j} α(i,j)²  (per example, averaged over the batch). The
minus sign is deliberate: Σα² is largest when α sits on one span, so subtracting it *rewards*
concentrated weights (the paper maximises log p(y|x) + λΣα²). λ is `reg_lambda` (≥ 0).

Cost: W₃ is linear, so W₁h_i + W₂h_j + W₃(h_j − h_i) = (W₁ − W₃)h_i + (W₂ + W₃)h_j exactly; these two
per-token projections are one matmul, from weights folded at each call (the parameters stay the
paper's four maps). Only W₄(h_i ⊙ h_j) needs the span itself. In eager mode only the valid spans
are computed (packed_spans: none over padding, past an input's end or over excluded tokens), so a
batch of short texts padded to its longest costs its spans, not its slots (2.3-2.5× faster on 16 SST-2
sentences padded to their longest, bench/span_packing.py), unless nearly every slot is valid
(PACK_BELOW). Without autograd (predict, explain, serve) the valid spans are made a chunk at a time
in one reused buffer (span_chunks: 1.3-1.4× the one-shot sums on SST-2 batches, 1.8× at 128 tokens,
where every slot is valid) and softmaxed online (pool_streaming), so they are never all held at once.
An exporter or a CUDA graph traces every (i, w) slot (`every_slot`, span_states, static_shapes), so
the shapes follow the input's alone; both give the same α and logits (tested). Memory grows as T·W,
never T², unless W = 0 ("all spans", W = T).

Which spans are valid: every token of the span is real (Features.mask) and, with
`special_tokens=exclude` (default), neither the first nor the last real token of the input, which
are the [CLS]/[SEP] a BERT-style tokenizer adds, so the rationales are words. An input made of
nothing but those (≤ 2 real tokens, e.g. an empty text) has no word to weigh: its spans are then
made over its special tokens, so α stays a distribution.

Sentence pairs: no span may contain the separator between the two texts (Features.separator), so
every span lies inside the premise or inside the hypothesis. A span across it would be the end of
one sentence glued to the start of the other: not a phrase of either, with no one character range
to show, and a rationale a reader cannot check against either text. Spans are still scored jointly
over both texts (one softmax), so α says which text the prediction leaned on. A row with no real token at all (never
produced by a tokenizer) has no valid span: α = 0 there, Ĥ = 0 and its logits are the output bias.

Span layout (extras["span_weights"], α): entry [b, i, w] is the span (i, i + w); 0 where invalid.

Legend: B batch, T tokens, D backbone width, D′ span width (`dim`), W span widths, C classes.
"""
from __future__ import annotations

import contextlib

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..head import Explanation, Features, Head, Output, TokenView, fewer_note, kept_from_weights, part_mark
from ..registry import MethodConfig, register_method


# With autograd, forward computes only the valid spans when they are at most this share of the (i, w) slots: the
# gathers that packing needs cost more than the slots they skip above about 0.88 (bench/span_packing.py,
# 1 thread: 0.92× at 95% valid, IMDB cut at 128 tokens; 2.3× at 54%, SST-2 padded to its longest).
PACK_BELOW = 0.85
# Spans computed at a time where no gradient is needed (inference): each chunk's product, sums and tanh
# are made in place while the chunk is in cache (1,024 × 384 floats, 1.5 MB), instead of streaming
# whole (N, D) temporaries through memory; the same sums in the same order (tanh through the sigmoid).
# Packing then pays at any share of valid spans (bench/span_packing.py, rows "forward (no grad)").
CHUNK_SPANS = 1024
# The bf16 span product's rows are padded to a multiple of this: oneDNN keeps state for every matrix shape
# it has multiplied in bf16, and a chunk of every row count from 1 to 1,024 grew a process by 652 MB
# (torch.mm, 1 thread; 13.8 MB with rows padded to multiples of 128), which took the 8-head server's peak
# RSS from 1.09x to 1.38x a 1-head server's (bench/REPORT.md, "The self-explaining head's span product in bf16").
LOW_PRODUCT_ROWS = 128


@dataclass
class SelfExplainConfig(MethodConfig):
    max_span_width: int = field(default=5, metadata={
        "help": "longest span in tokens (W); 0 = all spans (W = T, memory grows as T²)"})
    dim: int = field(default=256, metadata={"help": "span representation width D′; 0 = the backbone's width"})
    reg_lambda: float = field(default=0.1, metadata={
        "help": "λ of the concentration reward: loss = CE − λ·Σα² (≥ 0; 0 turns it off)"})
    special_tokens: str = field(default="exclude", metadata={
        "help": "whether spans may contain the first and last real token ([CLS]/[SEP] of BERT-style "
                "tokenizers): exclude keeps rationales to words; include for a tokenizer that adds none",
        "choices": ("exclude", "include")})
    dropout: float = field(default=0.1, metadata={"help": "dropout on the weighted span sum Ĥ", "fraction": True})

    def validate(self) -> None:
        if self.max_span_width < 0:
            raise ValueError(f"selfexplain: --max-span-width {self.max_span_width}: use a width ≥ 1, or 0 for all spans")
        if self.dim < 0:
            raise ValueError(f"selfexplain: --dim {self.dim}: use a width ≥ 1, or 0 for the backbone's width")
        if self.reg_lambda < 0:
            raise ValueError(f"selfexplain: --reg-lambda {self.reg_lambda}: use λ ≥ 0 (the loss already subtracts "
                             f"λ·Σα², which rewards concentrated weights)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"selfexplain: --dropout {self.dropout}: use a value in [0, 1)")


def span_tokens(mask: Tensor, exclude_edges: bool) -> Tensor:
    """(B, T) bool real tokens → (B, T) bool tokens a span may contain. With exclude_edges, the
    first and last real token are left out of inputs that have any other real token."""
    if not exclude_edges:
        return mask
    pos = torch.arange(mask.shape[1], device=mask.device)[None, :]  # (1, T)
    first = torch.where(mask, pos, mask.shape[1]).amin(1, keepdim=True)  # (B, 1)
    last = torch.where(mask, pos, -1).amax(1, keepdim=True)  # (B, 1)
    inner = mask & (pos != first) & (pos != last)  # (B, T)
    only_edges = ~inner.any(1, keepdim=True)  # (B, 1) e.g. "[CLS] [SEP]" alone
    return (only_edges & mask) | inner  # inner ⊆ mask; a boolean select as logic (ONNX Runtime has no bool Where)


def span_mask(allowed: Tensor, width: int) -> Tensor:
    """(B, T) bool allowed tokens → (B, T, W) bool: span (i, i + w) is valid iff it ends inside
    the input and every token in it is allowed (so no span crosses padding)."""
    B, T = allowed.shape
    count = F.pad(allowed.long().cumsum(1), (1, 0))  # (B, T + 1): allowed tokens before each position
    w = torch.arange(width, device=allowed.device)  # (W,)
    i = torch.arange(T, device=allowed.device)[:, None]  # (T, 1)
    end = (i + w + 1).clamp(max=T)  # (T, W) one past the span's last token
    inside = count[:, end] - count[:, i]  # (B, T, W) allowed tokens in the span
    return (i + w < T)[None] & (inside == w + 1)


def masked_softmax(scores: Tensor, valid: Tensor) -> Tensor:
    """(B, ...) scores, (B, ...) bool → (B, ...) softmax over each row's valid entries; invalid
    entries are exactly 0, and a row with no valid entry is all 0 (not NaN, in value or gradient)."""
    flat, ok = scores.flatten(1), valid.flatten(1)  # (B, N)
    filled = flat.masked_fill(~ok, float("-inf"))
    filled = filled.masked_fill(~ok.any(1, keepdim=True), 0.0)  # empty rows: finite, zeroed below
    return (filled.softmax(-1) * ok).view_as(scores)


def concentration(alpha: Tensor) -> Tensor:
    """(B, T, W) span weights → (B,) Σα² per example: 1 on a single span, 1/n spread over n."""
    return alpha.pow(2).flatten(1).sum(1)


class SelfExplainHead(Head):
    """Span representations, an interpretation layer (softmax over spans) and a linear output
    layer on the α-weighted sum of spans."""

    def __init__(self, cfg: SelfExplainConfig, dim: int, num_labels: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim or dim
        self.w1 = nn.Linear(dim, d)  # h_i (carries the one bias of h(i,j))
        self.w2 = nn.Linear(dim, d, bias=False)  # h_j
        self.w3 = nn.Linear(dim, d, bias=False)  # h_j − h_i
        self.w4 = nn.Linear(dim, d, bias=False)  # h_i ⊙ h_j
        self.interpret = nn.Linear(d, 1)  # span → score, softmaxed into α
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(d, num_labels)
        # False: forward computes the valid spans only (packed_spans, a count the data decides) where
        # they are few enough (PACK_BELOW); True: always every (i, w) slot (span_states), shapes known
        # from the input's: what an exporter traces
        self.every_slot = False

    def fused_maps(self) -> tuple[Tensor, Tensor]:
        """((2D′, D) weight, (2D′,) bias) of the two per-token maps: W₁ − W₃ over W₂ + W₃, and the one
        bias, which goes with h_i."""
        d = self.w4.out_features
        fused = torch.cat([self.w1.weight - self.w3.weight, self.w2.weight + self.w3.weight])  # (2D′, D)
        return fused, torch.cat([self.w1.bias, self.w1.bias.new_zeros(d)])

    def end_maps(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(..., D) states → ((W₁ − W₃)h + b, (W₂ + W₃)h), each (..., D′): a span's start and end
        terms, W₃ folded into the two per-token maps and both computed in one matmul."""
        fused, bias = self.fused_maps()
        start, end = F.linear(hidden, fused, bias).split(self.w4.out_features, -1)
        return start, end

    def span_states(self, hidden: Tensor, width: int) -> Tensor:
        """(B, T, D) → (B, T, W, D′): entry [b, i, w] is h(i, i + w); zeros past the input's end.
        W₃ folded into the two per-token maps (one matmul for both); every span's end token gathered
        at once (no Python loop over widths, so a traced graph keeps T and W symbolic: ONNX export)."""
        B, T, _ = hidden.shape
        start, end = self.end_maps(hidden)  # (B, T, D′) each
        j = torch.arange(T, device=hidden.device)[:, None] + torch.arange(width, device=hidden.device)  # (T, W) i + w
        inside = (j < T)[None, :, :, None]  # (1, T, W, 1) spans that end inside the input
        j = j.clamp(max=T - 1)
        pre = start[:, :, None] + end[:, j] + self.w4(hidden[:, :, None] * hidden[:, j])  # (B, T, W, D′)
        return torch.tanh(pre) * inside

    def low_weights(self, low: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """Without autograd, for product_dtype `low` (bf16): the fused end-map weight (D, 2D′) and
        W₄ᵀ (D, D′) rounded to `low`, and the fp32 bias (2D′,); kept until a parameter is replaced or
        changed in place (head.kept_from_weights)."""
        def make() -> tuple[Tensor, Tensor, Tensor]:
            fused, bias = self.fused_maps()
            return fused.to(low).t().contiguous(), self.w4.weight.to(low).t().contiguous(), bias

        return kept_from_weights(self, "_low_weights", make, low)

    def low_end_maps(self, hidden: Tensor, low: torch.dtype) -> tuple[Tensor, Tensor]:
        """end_maps without autograd for (R, D) rows, with the rows and the fused weight rounded to
        `low` (low_weights): sums in fp32 inside the product, the result rounded to `low`, then the
        fp32 bias added. On this CPU (AVX-512 BF16) the head ran 1.27-1.41× as fast as with these maps
        in fp32 (bench/REPORT.md, "Where the 8-head server's time goes under load, and the end maps in
        bf16")."""
        maps, _, bias = self.low_weights(low)
        start, end = low_mm(hidden, maps).float().add_(bias).split(self.w4.out_features, -1)
        return start, end

    def packed_spans(self, hidden: Tensor, valid: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """(B, T, D) states, (B, T, W) bool valid spans → (N, D′) h(i, j) of the N valid spans only,
        and their (b, i, w) indices (each (N,), in row-major order). The same sums as span_states, but
        no span over padding, past an input's end or over excluded tokens is computed: a batch of
        short texts padded to its longest holds about half as many valid spans as slots. The
        autograd path; inference makes the same spans a chunk at a time (span_parts, span_chunks)."""
        flat, first, last, rows, at, bi = valid_span_rows(hidden, valid)
        start, end = self.end_maps(flat.index_select(0, rows))  # (R, D′) each
        ends = start.index_select(0, at[first]) + end.index_select(0, at[last])  # (N, D′)
        prod = flat.index_select(0, first) * flat.index_select(0, last)  # (N, D) h_i ⊙ h_j
        pre = torch.addmm(ends, prod, self.w4.weight.t())  # (N, D′) the sum of the four maps
        return torch.tanh(pre), bi

    def span_parts(self, hidden: Tensor, valid: Tensor,
                   product: torch.dtype = torch.float32) -> tuple["SpanParts", tuple[Tensor, Tensor, Tensor]]:
        """Without autograd: what span_chunks makes the N valid spans' h(i, j) from (SpanParts: the
        per-token start and end terms, in `product`'s precision where that is bf16 (low_end_maps), and
        W₄ᵀ), and their (b, i, w) indices, as packed_spans."""
        flat, first, last, rows, at, bi = valid_span_rows(hidden, valid)
        used_rows = flat.index_select(0, rows)  # (R, D)
        if product == torch.float32:
            (start, end), w4 = self.end_maps(used_rows), self.w4.weight.t()  # (R, D′) each, (D, D′)
        else:
            (start, end), w4 = self.low_end_maps(used_rows, product), self.low_weights(product)[1]
        return SpanParts(flat, first, last, start, end, at[first], at[last], w4), bi

    def forward(self, f: Features) -> Output:
        T = f.hidden.shape[1]
        width = min(self.cfg.max_span_width or T, T)
        hidden = f.hidden.masked_fill(~f.mask[..., None], 0.0)  # (B, T, D) padding can hold no NaN/inf
        allowed = span_tokens(f.mask, self.cfg.special_tokens == "exclude")  # (B, T)
        if f.separator is not None:  # a pair: spans stay inside one of its texts
            allowed = allowed & ~f.separator
        valid = span_mask(allowed, width)  # (B, T, W)
        dense = torch.is_grad_enabled() and valid.sum() > PACK_BELOW * valid.numel()  # training, little to skip
        if self.every_slot or dense:  # export, or packing would not pay
            spans = self.span_states(hidden, width)  # (B, T, W, D′)
            alpha = masked_softmax(self.interpret(spans).squeeze(-1), valid)  # (B, T, W)
            pooled = torch.einsum("btw,btwd->bd", alpha, spans)  # (B, D′) Ĥ
        elif not torch.is_grad_enabled():  # inference: the valid spans a chunk at a time, never all at once
            parts, (b, i, w) = self.span_parts(hidden, valid, product_dtype(f.precision, hidden.device))
            pooled, scores = self.pool_streaming(parts, b, valid.shape[0])  # (B, D′), (N,)
            alpha = masked_softmax(scores.new_zeros(valid.shape).index_put((b, i, w), scores), valid)  # (B, T, W)
        else:  # training: the valid spans only (packed_spans), the same α and Ĥ
            spans, (b, i, w) = self.packed_spans(hidden, valid)  # (N, D′)
            scores = self.interpret(spans).squeeze(-1)  # (N,)
            alpha = masked_softmax(scores.new_zeros(valid.shape).index_put((b, i, w), scores), valid)  # (B, T, W)
            weighted = alpha[b, i, w, None] * spans  # (N, D′)
            pooled = weighted.new_zeros(valid.shape[0], spans.shape[-1]).index_add(0, b, weighted)  # (B, D′) Ĥ
        return Output(self.out(self.drop(pooled)), {"span_weights": alpha})  # (B, C)

    def pool_streaming(self, parts: "SpanParts", b: Tensor, B: int) -> tuple[Tensor, Tensor]:
        """Without autograd: Ĥ = Σ α·h(i, j) per input and the N spans' scores, with the spans made
        CHUNK_SPANS at a time into one reused buffer (span_chunks) and softmaxed online: each input
        keeps its largest score so far m, Σ exp(s − m) and Σ exp(s − m)·h, rescaled by exp(m_old −
        m_new) when m grows. So no (N, D′) tensor of all spans is ever held: for 16 texts of 128
        tokens that was 24 MB per batch in a server (bench/REPORT.md, "Streaming the self-explaining
        head"). b: (N,) each span's input; returns ((B, D′) Ĥ, (N,) scores); an input with no valid
        span gets Ĥ = 0, as masked_softmax gives it α = 0."""
        d = self.w4.out_features
        scores = parts.start.new_empty(len(b))  # (N,)
        top = parts.start.new_full((B,), float("-inf"))  # (B,) m
        total = parts.start.new_zeros(B)  # (B,) Σ exp(s − m)
        acc = parts.start.new_zeros(B, d)  # (B, D′) Σ exp(s − m)·h
        for c, o in span_chunks(parts):
            s = self.interpret(o).squeeze(-1)  # (n,)
            scores[c] = s
            bc = b[c]
            new = top.scatter_reduce(0, bc, s, "amax")  # (B,) m_new
            scale = torch.where(new == top, 1.0, torch.exp(top - new))  # (B,) 1 where m stayed (also −inf)
            total.mul_(scale)
            acc.mul_(scale[:, None])
            e = torch.exp(s - new[bc])  # (n,)
            total.index_add_(0, bc, e)
            acc.index_add_(0, bc, o.mul_(e[:, None]))
            top = new
        return torch.where(total[:, None] > 0, acc / total.clamp_min(1e-30)[:, None], 0.0), scores

    @contextlib.contextmanager
    def static_shapes(self) -> Iterator[None]:
        """every_slot for the duration: all (i, w) slots, so no count of valid spans is read on the host
        (what a CUDA graph records; the same α and logits as the valid spans alone, tested)."""
        kept, self.every_slot = self.every_slot, True
        try:
            yield
        finally:
            self.every_slot = kept

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        """CE − λ·mean_b Σα²: the minus rewards concentrated span weights."""
        ce = F.cross_entropy(out.logits, labels)
        return ce - self.cfg.reg_lambda * concentration(out.extras["span_weights"]).mean()

    def explain(self, out: Output, tokens: TokenView, labels: list[str], top: int) -> Explanation:
        """The `top` spans by α, as original text with their character range [start, end) in
        tokens.text (null for a span of special tokens only, which has no characters). Spans are grown
        to whole words, so spans that start or end inside the same words are listed once, with the
        largest α of them."""
        alpha = out.extras["span_weights"][0].detach()  # (T, W)
        n = len(tokens.pieces)
        if alpha.shape[0] < n:
            raise ValueError(f"span weights cover {alpha.shape[0]} tokens but the input has {n}; "
                             f"pass the head's output for this input alone")
        spans = tokens.ranked(top_spans(alpha[:n]), top)
        lines = [f'{s["weight"]:.2f}  "{s["text"]}"{part_mark(s)}' for s in spans]
        widest = f"up to {self.cfg.max_span_width} tokens" if self.cfg.max_span_width else "any width"
        lines += fewer_note(len(spans), top,
                            f"the text has no more distinct spans of weight > 0 (whole words, {widest})")
        return Explanation({"spans": spans}, lines)


@dataclass
class SpanParts:
    """What the N valid spans' h(i, j) are made from without autograd. flat (B·T, D) states; first,
    last: (N,) each, the rows of flat a span starts and ends at; start, end: the (R, D′) start and end
    terms (end_maps) of the R tokens used; start_row, end_row: (N,) each, a span's rows in them;
    w4: W₄ᵀ (D, D′), fp32 or bf16."""
    flat: Tensor
    first: Tensor
    last: Tensor
    start: Tensor
    end: Tensor
    start_row: Tensor
    end_row: Tensor
    w4: Tensor


def span_chunks(p: SpanParts) -> Iterator[tuple[slice, Tensor]]:
    """Without autograd: (c, h) for each chunk c of CHUNK_SPANS spans, h (n, D′) their h(i, j), made
    in one buffer that the next chunk reuses: the same sums as packed_spans makes with autograd, in the
    same order; tanh through the sigmoid (within 2·10⁻⁷ of torch.tanh, absolute; |tanh| ≤ 1).

    w4 in bfloat16 (product_dtype, low_weights): W₄(h_i ⊙ h_j), the one product per span and most of
    the head's time, with h_i ⊙ h_j rounded to bf16 (sums in fp32 inside the product, the result
    rounded to bf16 and added to the fp32 terms); the rest stays fp32."""
    N, d = len(p.first), p.w4.shape[1]
    buf = p.start.new_empty(min(N, CHUNK_SPANS), d)
    for k in range(0, N, CHUNK_SPANS):
        c = slice(k, min(k + CHUNK_SPANS, N))
        o = torch.add(p.start.index_select(0, p.start_row[c]), p.end.index_select(0, p.end_row[c]),
                      out=buf[:c.stop - c.start])  # (n, D′)
        prod = p.flat.index_select(0, p.first[c]).mul_(p.flat.index_select(0, p.last[c]))  # (n, D) h_i ⊙ h_j
        if p.w4.dtype == torch.float32:
            o.addmm_(prod, p.w4)  # + W₄(h_i ⊙ h_j)
        else:
            o.add_(low_mm(prod, p.w4))
        o.mul_(2).sigmoid_().mul_(2).sub_(1)  # tanh x = 2σ(2x) − 1: 4× faster than torch's tanh on the CPU
        yield c, o


def valid_span_rows(hidden: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                            tuple[Tensor, Tensor, Tensor]]:
    """(B, T, D) states, (B, T, W) bool valid spans → flat (B·T, D) states; first, last (N,): the rows
    of flat each valid span starts and ends at; rows (R,): the tokens some valid span starts or ends
    at; at (B·T,): a flat row's place among them; and the spans' (b, i, w), each (N,), row-major."""
    B, T, D = hidden.shape
    b, i, w = valid.nonzero(as_tuple=True)  # (N,) each
    flat = hidden.reshape(B * T, D)
    first, last = b * T + i, b * T + i + w  # (N,) rows of flat: the span's first and last token
    used = torch.zeros(B * T, dtype=torch.bool, device=hidden.device)
    used[first] = True
    used[last] = True
    rows = used.nonzero().squeeze(1)  # (R,) tokens some valid span starts or ends at
    at = torch.zeros(B * T, dtype=torch.long, device=hidden.device)
    at[rows] = torch.arange(len(rows), device=hidden.device)  # flat row → its row in the projections
    return flat, first, last, rows, at, (b, i, w)


def low_mm(x: Tensor, w: Tensor) -> Tensor:
    """(n, D) @ (D, K) in w's 16-bit dtype, x rounded to it: (n, K) in that dtype. The rows are padded
    to a multiple of LOW_PRODUCT_ROWS, so that the 16-bit kernels see few shapes."""
    n = x.shape[0]
    padded = x.new_zeros(-(-n // LOW_PRODUCT_ROWS) * LOW_PRODUCT_ROWS, x.shape[1], dtype=w.dtype)
    padded[:n] = x
    return torch.mm(padded, w)[:n]


def product_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the no-grad span product for states made in `precision` on `device`: bfloat16 when
    the pass itself ran in bf16 where the hardware multiplies bf16 natively (a CPU with AVX-512 BF16 or
    AMX, a CUDA GPU), else float32. On this CPU it made the whole head 1.42-1.48× faster and changed none
    of 4,454 test predictions of four models (SST-2 ×2, TREC, SST-5; bench/REPORT.md, "The
    self-explaining head's span product in bf16")."""
    if precision != "bf16":
        return torch.float32
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu":
        from ..extract.device import native_bf16

        return torch.bfloat16 if native_bf16() else torch.float32
    return torch.float32


def top_spans(alpha: Tensor, top: int | None = None) -> list[tuple[int, int, float]]:
    """(n, W) span weights of one input → up to `top` (all when None) (i, j, α) with α > 0, largest first."""
    flat = alpha.flatten()
    positive = int((flat > 0).sum())
    weights, idx = flat.topk(positive if top is None else min(top, positive))
    width = alpha.shape[1]
    return [(int(k) // width, int(k) // width + int(k) % width, float(v)) for v, k in zip(weights, idx)]



register_method("selfexplain", SelfExplainConfig,
                "self-explaining spans: classify from an α-weighted sum of span representations; α is the rationale",
                train_defaults={"lr": 1e-3, "epochs": 20, "batch_size": 32, "patience": 5})(SelfExplainHead)
