import pytest
import torch

from frozentune.backbone import Backbone
from frozentune.head import Features, Output
from frozentune.heads.self_explaining import SelfExplainHead, concentration, span_mask, span_tokens
from frozentune.registry import MethodError, create_method
from numerics import ACTIVATION, approx, assert_close, dot, exact, linear, softmax


def span_ops(D: int = 32) -> int:
    """h(i, j): h_i ⊙ h_j (1), a projection of D inputs, the sum of the three projections (2), tanh."""
    return 1 + linear(D) + 2 + ACTIVATION


def alpha_ops(n: int, D: int = 32, d: int = 16) -> int:
    """α over n span slots: span states, the interpretation layer (d inputs), softmax over n."""
    return span_ops(D) + linear(d) + softmax(n)


def logits_ops(n: int, D: int = 32, d: int = 16) -> int:
    """Logits: α, the α-weighted sum over n span slots, the output layer (d inputs)."""
    return alpha_ops(n, D, d) + dot(n) + linear(d)


def feats(lengths=(7, 5, 3), T=7, D=32, seed=0) -> Features:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(lengths), T, D, generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return Features(hidden * mask[..., None], mask)


def head_for(options=None, D=32, C=3, seed=0) -> SelfExplainHead:
    torch.manual_seed(seed)
    head, _ = create_method("selfexplain", D, C, {"dim": 16, **(options or {})})
    return head.eval()


def expected_valid(length: int, T: int, W: int, exclude: bool) -> torch.Tensor:
    """(T, W) bool, written span by span: the spans (i, i + w) the head may weigh."""
    lo, hi = (1, length - 2) if exclude and length >= 3 else (0, length - 1)
    out = torch.zeros(T, W, dtype=torch.bool)
    for i in range(T):
        for w in range(W):
            out[i, w] = lo <= i and i + w <= hi
    return out


@pytest.mark.parametrize("special", ["exclude", "include"])
@pytest.mark.parametrize("width", [3, 0])
def test_alpha_is_a_distribution_over_exactly_the_valid_spans(special, width):
    f = feats()
    head = head_for({"max_span_width": width, "special_tokens": special})
    alpha = head(f).extras["span_weights"]  # (B, T, W)
    W = width or 7
    assert alpha.shape == (3, 7, W)
    assert_close(alpha.sum((1, 2)), torch.ones(3), ops=softmax(7 * W) + dot(7 * W), what="Σα")
    for b, length in enumerate((7, 5, 3)):
        want = expected_valid(length, 7, W, special == "exclude")
        # exact (bool): invalid spans are multiplied by 0, valid ones are exp of a finite score > 0
        assert torch.equal(alpha[b] > 0, want), f"row {b} (length {length})"
    if special == "exclude":  # no weight ever touches [CLS] (position 0) or [SEP] (length − 1); exact zeros
        assert (alpha[:, 0] == 0).all() and alpha[1, 4].sum() == 0 and alpha[1, 3, 1:].sum() == 0


@pytest.mark.parametrize("length, width", [(7, 5), (7, 1), (7, 0), (12, 3), (4, 9), (3, 0)])
@pytest.mark.parametrize("exclude", [True, False])
def test_number_of_valid_spans_is_the_closed_form(length, width, exclude):
    T = length + 2  # two padding positions
    mask = (torch.arange(T) < length)[None]
    W = width or T
    n = length - 2 if exclude else length  # tokens a span may contain
    k = min(W, n)
    want = k * n - k * (k - 1) // 2  # Σ_{w<k} (n − w); W ≥ n gives n(n+1)/2
    assert int(span_mask(span_tokens(mask, exclude), W).sum()) == want
    if width == 0:
        assert want == n * (n + 1) // 2


def test_spans_cannot_cross_padding_inside_the_mask():
    # a hole in the mask: real tokens 0..2 and 4..5; every span touching position 3 is invalid
    allowed = torch.tensor([[True, True, True, False, True, True]])
    valid = span_mask(allowed, 6)[0]  # (T, W)
    for i in range(6):
        for w in range(6):
            crosses = i <= 3 <= i + w or i + w >= 6
            assert bool(valid[i, w]) == (not crosses), (i, w)


@pytest.mark.parametrize("width", [5, 0])
def test_padding_does_not_change_the_output(width):
    head = head_for({"max_span_width": width})
    f = feats()
    garbage = 100 * torch.randn(3, 4, 32)
    garbage[0, 0, 0] = float("nan")
    longer = Features(torch.cat([f.hidden, garbage], 1), torch.cat([f.mask, torch.zeros(3, 4, dtype=torch.bool)], 1))
    a, b = head(f), head(longer)
    assert torch.isfinite(b.logits).all()
    wa, wb = a.extras["span_weights"], b.extras["span_weights"]
    n = wb.shape[1] * wb.shape[2]  # span slots of the longer input: its softmax and weighted sum run over more zeros
    assert_close(a.logits, b.logits, ops=logits_ops(n), what="logits")
    assert_close(wa, wb[:, :7, :wa.shape[2]], ops=alpha_ops(n), what="α")
    assert wb[:, 7:].sum() == 0 and wb[:, :, wa.shape[2]:].sum() == 0  # exact zeros: spans over padding are masked


def test_batched_spans_equal_a_loop_over_spans():
    head = head_for({"max_span_width": 3})
    f = feats(lengths=(6, 4), T=6)
    out = head(f)
    for b, length in enumerate((6, 4)):
        h = f.hidden[b]
        spans, keys = [], []
        for i in range(1, length - 1):  # [CLS] and [SEP] excluded
            for j in range(i, min(i + 3, length - 1)):
                pre = head.w1(h[i]) + head.w2(h[j]) + head.w3(h[j] - h[i]) + head.w4(h[i] * h[j])
                spans.append(torch.tanh(pre))
                keys.append((i, j - i))
        spans = torch.stack(spans)  # (n, D′)
        alpha = torch.softmax(head.interpret(spans).squeeze(-1), 0)  # (n,)
        logits = head.out((alpha[:, None] * spans).sum(0))
        # batched (fused projections, softmax over all T·W slots) vs one span at a time
        assert_close(out.logits[b], logits, ops=logits_ops(6 * 3), what=f"logits row {b}")
        got = out.extras["span_weights"][b]
        assert_close(torch.stack([got[i, w] for i, w in keys]), alpha, ops=alpha_ops(6 * 3), what=f"α row {b}")
    batched = head.span_states(f.hidden, 3)  # (B, T, W, D′)
    i, j = 2, 4
    h = f.hidden[0]
    one = torch.tanh(head.w1(h[i]) + head.w2(h[j]) + head.w3(h[j] - h[i]) + head.w4(h[i] * h[j]))
    assert_close(batched[0, i, j - i], one, ops=span_ops(), what="span state")


@pytest.mark.parametrize("width", [3, 0])
def test_valid_spans_only_equal_every_slot(width):
    """Eager forward computes the valid spans only (packed_spans); an export traces every (i, w)
    slot (span_states). Same logits, α and gradients, on padded rows and a pair's separator."""
    head = head_for({"max_span_width": width})
    f = feats(lengths=(7, 5, 3, 2, 0), T=7)
    f = Features(f.hidden, f.mask, torch.zeros_like(f.mask).index_fill(1, torch.tensor([3]), True) & f.mask)
    y = torch.tensor([0, 2, 1, 0, 1])

    def run():
        head.zero_grad()
        out = head(f)
        head.loss(out, y).backward()
        return out, {n: p.grad.clone() for n, p in head.named_parameters()}

    packed, g_packed = run()
    head.every_slot = True
    dense, g_dense = run()
    n = 7 * (width or 7)
    assert_close(packed.logits, dense.logits, ops=logits_ops(n), what="logits")
    assert_close(packed.extras["span_weights"], dense.extras["span_weights"], ops=alpha_ops(n), what="α")
    # the backward of the same sums: one more pass over the same slots. Scaled by the largest gradient:
    # the interpretation layer's bias has gradient 0 (softmax ignores a shift), reached by cancellation
    scale = max(float(g.abs().max()) for g in g_dense.values())
    for name, g in g_dense.items():
        assert_close(g_packed[name], g, ops=2 * logits_ops(n) + dot(5 * n), scale=scale, what=f"∂loss/∂{name}")


@pytest.mark.parametrize("width", [3, 0])
def test_inference_in_chunks_equals_the_autograd_forward(width, monkeypatch):
    """Without autograd the valid spans are made a chunk at a time, in place, tanh through the sigmoid
    (span_chunks): the same logits and α as the autograd forward (packed and every slot), with
    chunks that split rows and a last partial chunk."""
    import frozentune.heads.self_explaining as se

    monkeypatch.setattr(se, "CHUNK_SPANS", 4)
    head = head_for({"max_span_width": width})
    f = feats(lengths=(7, 5, 3, 2, 0), T=7)
    f = Features(f.hidden, f.mask, torch.zeros_like(f.mask).index_fill(1, torch.tensor([3]), True) & f.mask)
    with torch.no_grad():
        chunked = head(f)
    n = 7 * (width or 7)
    for every in (False, True):
        head.every_slot = every
        reference = head(f)  # autograd on: the one-shot sums
        assert reference.logits.requires_grad
        assert_close(chunked.logits, reference.logits, ops=logits_ops(n) + 1, what=f"logits (every slot: {every})")
        assert_close(chunked.extras["span_weights"], reference.extras["span_weights"], ops=alpha_ops(n) + 1,
                     what=f"α (every slot: {every})")
    assert (chunked.extras["span_weights"][4] == 0).all()  # the empty row: no valid span, α = 0


@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_streamed_pooling_equals_softmax_then_sum(chunk, monkeypatch):
    """Without autograd Ĥ is softmaxed online over chunks of spans (pool_streaming: each input's
    running max, Σ exp and Σ exp·h, rescaled when the max grows), never holding all N spans. With
    scores spread over several units (the interpretation layer scaled up), so that a later chunk's
    larger score really rescales what came before, and chunks that split inputs: the same logits as
    softmax-then-sum with autograd. Tolerance: the logits' own operations, plus one rounding per
    rescale (at most one per chunk), the exponential and the final division."""
    import math

    import frozentune.heads.self_explaining as se

    monkeypatch.setattr(se, "CHUNK_SPANS", chunk)
    head = head_for({"max_span_width": 0, "special_tokens": "include"})
    with torch.no_grad():
        head.interpret.weight.mul_(40.0)
    f = feats(lengths=(7, 6, 3, 1, 0), T=7)
    with torch.no_grad():
        streamed = head(f)
    reference = head(f)  # autograd on: packed spans, softmax, then the α-weighted sum
    assert reference.logits.requires_grad
    alpha = reference.extras["span_weights"][0].detach()  # (T, W) of the longest input
    log_alpha = alpha[alpha > 0].log()  # score differences: log α_k − log α_l = s_k − s_l
    assert float(log_alpha.max() - log_alpha.min()) > 5.0  # the scores are spread: rescaling matters
    n = 7 * 7
    ops = logits_ops(n) + math.ceil(n / chunk) + 3
    assert_close(streamed.logits, reference.logits, ops=ops, what=f"logits, chunks of {chunk}")
    assert_close(streamed.extras["span_weights"], reference.extras["span_weights"], ops=alpha_ops(n) + 1, what="α")
    assert (streamed.extras["span_weights"][4] == 0).all()  # the empty input: α = 0 and Ĥ = 0, not NaN
    assert torch.isfinite(streamed.logits).all()


def test_loss_is_ce_minus_lambda_times_concentration():
    head = head_for({"reg_lambda": 0.5})
    f, y = feats(), torch.tensor([0, 2, 1])
    out = head(f)
    ce = torch.nn.functional.cross_entropy(out.logits, y)
    sq = out.extras["span_weights"].pow(2).sum((1, 2))  # (B,)
    # the same CE; Σα² over (T, W) reduced in another shape, then the batch mean and λ·
    assert_close(head.loss(out, y), ce - 0.5 * sq.mean(), ops=1 + dot(7 * 5) + dot(3) + 2, what="loss")
    # same logits (same CE): concentrating α on one span lowers the loss
    spread = torch.full((1, 4, 1), 0.25)
    peaked = torch.tensor([[[1.0], [0.0], [0.0], [0.0]]])
    logits = torch.tensor([[0.3, -0.2, 0.1]])
    lo = head.loss(Output(logits, {"span_weights": peaked}), y[:1])
    hi = head.loss(Output(logits, {"span_weights": spread}), y[:1])
    # the same CE in both (same logits): only the two subtractions round, relative to the losses' size
    assert float(hi - lo) == approx(0.5 * (1.0 - 0.25), ops=3, scale=float(hi))
    assert concentration(peaked).item() == 1.0 and concentration(spread).item() == 0.25  # exact: powers of two


def test_only_special_tokens_and_empty_rows_stay_finite():
    head = head_for()
    f = feats(lengths=(2, 1, 0, 5))
    out = head(f)
    assert torch.isfinite(out.logits).all()
    alpha = out.extras["span_weights"]
    # "[CLS] [SEP]" alone: its spans are made over the special tokens, α still sums to 1
    slots = alpha.shape[1] * alpha.shape[2]
    assert alpha[0].sum().item() == approx(1.0, ops=softmax(slots) + dot(slots))
    assert alpha[1].sum().item() == approx(1.0, ops=softmax(slots) + dot(slots))
    assert torch.equal(alpha[0] > 0, expected_valid(2, 7, 5, exclude=False))  # (0,0) (0,1) (1,1)
    assert alpha[1, 0, 0].item() == 1.0  # a lone token: the one span; exact: exp(0) / (exp(0) + exp(−inf)·…)
    # no real token: no span, Ĥ = 0, the logits are the output layer's bias
    assert alpha[2].sum() == 0  # exact zeros
    exact(out.logits[2], head.out.bias, "Ĥ = 0 exactly, so the output layer gives 0·W + b = b")
    loss = head.loss(out, torch.tensor([0, 1, 2, 0]))
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)


def test_explanation_offsets_slice_the_original_text(tiny_bert):
    bb = Backbone.load(str(tiny_bert), max_length=32)
    text = "The movie was not  good, really!"
    view = bb.tokenize_with_views([text])[1][0]  # [CLS] the movie was not good , really ! [SEP]
    n = len(view.pieces)
    assert view.pieces[4:6] == ["not", "good"]
    head = head_for({"max_span_width": 3}, D=bb.dim, C=2)
    f = Features(torch.randn(1, n, bb.dim), torch.ones(1, n, dtype=torch.bool))
    ex = head.explain(head(f), view, ["neg", "pos"], top=4)
    spans = ex.data["spans"]
    assert len(spans) == 4 and len(ex.lines) == 4
    assert [s["weight"] for s in spans] == sorted((s["weight"] for s in spans), reverse=True)
    for s in spans:
        assert text[s["start"]:s["end"]] == s["text"] and s["text"].strip() and "[" not in s["text"]

    # weights placed by hand: the top span is (4, 5) = "not  good", exactly as typed
    alpha = torch.zeros(1, n, 3)
    alpha[0, 4, 1], alpha[0, 7, 0], alpha[0, 1, 2] = 0.6, 0.3, 0.1  # (4,5), (7,7), (1,3)
    ex = head.explain(Output(torch.zeros(1, 2), {"span_weights": alpha}), view, ["neg", "pos"], top=5)
    assert [(s["text"], s["start"], s["end"]) for s in ex.data["spans"]] == [
        ("not  good", 14, 23), ("really", 25, 31), ("The movie was", 0, 13)]
    assert ex.lines[0] == '0.60  "not  good"'
    assert ex.lines[3] == "(3 of the 5 asked for: the text has no more distinct spans of weight > 0 (whole words, up to 3 tokens))"

    # with special_tokens=include a span may hold [SEP]: it adds no characters; alone it has none
    alpha = torch.zeros(1, n, 3)
    alpha[0, 7, 2], alpha[0, 9, 0] = 0.7, 0.3  # (7, 9) = "really ! [SEP]", (9, 9) = "[SEP]"
    ex = head.explain(Output(torch.zeros(1, 2), {"span_weights": alpha}), view, ["neg", "pos"], top=5)
    assert [(s["text"], s["start"], s["end"]) for s in ex.data["spans"]] == [
        ("really!", 25, 32), ("[SEP]", None, None)]


@pytest.mark.parametrize("options, needle", [
    ({"max_span_width": -1}, "--max-span-width -1: use a width"),
    ({"reg_lambda": -0.1}, "use λ ≥ 0"),
    ({"dim": -4}, "--dim -4: use a width"),
    ({"special_tokens": "keep"}, "choose one of exclude, include"),
    # a value of the wrong kind names the choices too (it said only "text is expected")
    ({"special_tokens": True}, "special_tokens=True: text is expected, one of exclude, include"),
])
def test_bad_options(options, needle):
    with pytest.raises(MethodError, match=needle):
        create_method("selfexplain", 32, 2, options)


def test_span_dim_zero_is_the_backbone_width():
    head, _ = create_method("selfexplain", 24, 2, {"dim": 0})
    assert head.w4.weight.shape == (24, 24) and head.out.weight.shape == (2, 24)


def test_span_product_in_bf16_only_for_a_native_bf16_pass():
    from frozentune.extract.device import native_bf16
    from frozentune.heads.self_explaining import product_dtype

    cpu = torch.device("cpu")
    for precision in ("fp32", "fp16", "int8"):
        assert product_dtype(precision, cpu) == torch.float32
    assert product_dtype("bf16", cpu) == (torch.bfloat16 if native_bf16() else torch.float32)
    assert product_dtype("bf16", torch.device("cuda")) == torch.bfloat16
    assert product_dtype("bf16", torch.device("mps")) == torch.float32


@pytest.mark.parametrize("width", [3, 0])
def test_bf16_span_product_stays_near_fp32(width, monkeypatch):
    """States from a bf16 pass: the no-grad span product W₄(h_i ⊙ h_j) and the per-token end maps in
    bf16. Each product's inputs and result are rounded to bf16 once (3 roundings each, 6 in all,
    relative to Σ|terms| of the products), and everything after them is fp32; the logits stay within
    that of the fp32 path, and do move (the bf16 path ran). Where the CPU has no native bf16 both stay
    fp32: equal bits."""
    import frozentune.heads.self_explaining as se
    from frozentune.extract.device import native_bf16
    from numerics import ROUNDING, assert_differs, tol

    monkeypatch.setattr(se, "CHUNK_SPANS", 4)
    head = head_for({"max_span_width": width})
    f = feats(lengths=(7, 5, 3, 2), T=7)
    with torch.no_grad():
        fp32 = head(f)
        bf16 = head(Features(f.hidden, f.mask, f.separator, "bf16"))
    if not native_bf16():
        exact(bf16.logits, fp32.logits, "no native bf16: the same fp32 product, the same kernels")
        return
    n = 7 * (width or 7)
    rtol = tol(torch.bfloat16, 6 * ROUNDING) + tol(torch.float32, logits_ops(n) + 1)
    assert_close(bf16.logits, fp32.logits, rtol=rtol, what="logits, bf16 product")
    assert_close(bf16.extras["span_weights"], fp32.extras["span_weights"], rtol=rtol, what="α, bf16 product")
    assert_differs(bf16.logits, fp32.logits, ops=logits_ops(n) + 1, what="logits: the bf16 product ran")


def test_bf16_weights_are_kept_and_remade_when_a_parameter_changes():
    """The bf16 copies of the fused end maps and of W₄ (SelfExplainHead.low_weights) are made once and
    reused, and made again when a parameter changes in place (an optimiser step, load_state_dict) or
    is replaced: the bf16 path's logits always equal a fresh head's with the same weights."""
    head = head_for({"max_span_width": 3})
    plain = feats(lengths=(7, 5), T=7)
    f = Features(plain.hidden, plain.mask, None, "bf16")
    low = torch.bfloat16
    with torch.no_grad():
        kept = head.low_weights(low)
        assert head.low_weights(low) is kept  # no change: reused, not remade
        head.w3.weight.add_(0.1 * torch.randn_like(head.w3.weight))  # in place, as an optimiser step
        assert head.low_weights(low) is not kept
        other = head_for({"max_span_width": 3}, seed=1)
        head.load_state_dict(other.state_dict())
        exact(head(f).logits, other(f).logits, "after load_state_dict")
        head.w4.weight = torch.nn.Parameter(torch.randn_like(head.w4.weight))  # replaced, not changed in place
        fresh = head_for({"max_span_width": 3})
        fresh.load_state_dict(head.state_dict())
        exact(head(f).logits, fresh(f).logits, "after a parameter was replaced")
