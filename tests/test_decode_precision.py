"""--precision for decoding (generation/precision.py): a frozen LM's linear layers in bf16 under
autocast, the rest in fp32. Checked: what the conversion changes and what it leaves alone; fp32 is
the LM untouched; bf16 logits stay near fp32's while a wrong prefix is far off; bad precisions are
refused with a message; `generate` and `eval` say the precision they decode in. Tiny random Llama
saved as a Hugging Face folder, a prefix trained on an E2E slice by the real CLI."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from clirun import cli
from conftest import head_of_files, make_tiny_llama
from frozentune.backbone import load_causal_lm, pad, weights_hash
from frozentune.cli import main
from frozentune.generation.precision import choose_decode_precision, decoding, for_decoding, precision_of
from frozentune.generation.prefix import PrefixBatch, PrefixConfig, PrefixError, PrefixTuner, cache_kwargs, positions
from numerics import eps, exact

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "name eatType food area near pub coffee shop the is a in city centre riverside Aromi Cotto serves Italian French cheap . , [ ]".split()
PROMPTS = [[5, 6, 7, 1], [8, 9, 1]]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), WORDS)


@pytest.fixture(scope="module")
def prefix_model(tiny_lm, tmp_path_factory, shared_data) -> Path:
    e2e = head_of_files(shared_data / "e2e", tmp_path_factory.mktemp("e2e"), {"dev": 24, "test": 4})
    out = tmp_path_factory.mktemp("runs") / "prefix"
    assert main(["train", "--method", "prefix", "--data", str(e2e), "--backbone", str(tiny_lm), "--output", str(out),
                 "--epochs", "1", "--max-train", "16", "--max-validation", "4", "--max-new-tokens", "6",
                 "--prefix-length", "2", "--lr", "1e-2", "--num-beams", "1", "--seed", "0"]) == 0
    return out


def _last_logits(lm, prefix: PrefixBatch) -> torch.Tensor:
    """(B, V) float32: the next-token logits after each prompt, decoded as generate() decodes."""
    ids, mask = pad(PROMPTS, 0, left=True)
    full = torch.cat([prefix.mask, mask.bool()], 1)
    with torch.no_grad(), decoding(lm):
        out = lm(input_ids=ids, attention_mask=full.long(), position_ids=positions(full, ids.shape[1]), use_cache=True,
                 **cache_kwargs(lm, prefix.cache(lm)))
    return out.logits[:, -1].float()


def test_bf16_converts_the_linear_layers_and_unties_the_output_layer(tiny_lm):
    lm, _ = load_causal_lm(str(tiny_lm))
    lm.get_output_embeddings().weight = lm.get_input_embeddings().weight  # tied, as SmolLM2's are
    embedding = lm.get_input_embeddings().weight.detach().clone()
    head = lm.get_output_embeddings().weight.detach().clone()
    norms = {n: p.detach().clone() for n, p in lm.named_parameters() if "norm" in n}
    assert for_decoding(lm, "bf16") is lm
    linears = [m for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    out, inp = lm.get_output_embeddings(), lm.get_input_embeddings()
    assert out.weight is not inp.weight
    exact(inp.weight, embedding, "the input embedding is not a linear layer: left as it was")
    exact(out.weight, head.to(torch.bfloat16), "the output layer's own copy, rounded once to bf16")
    for n, p in lm.named_parameters():
        if n in norms:
            exact(p, norms[n], f"{n}: norms stay fp32, untouched")
    assert precision_of(lm) == "bf16"
    assert not any(p.requires_grad for p in lm.parameters())


def test_fp32_leaves_the_lm_as_it_is(tiny_lm):
    lm, _ = load_causal_lm(str(tiny_lm))
    before = weights_hash(lm)
    assert for_decoding(lm, "fp32") is lm and weights_hash(lm) == before and precision_of(lm) == "fp32"


def test_bf16_logits_are_near_fp32_and_the_prefix_still_counts(tiny_lm):
    """bf16 rounds each linear layer's input, weight and output (8 significant bits: eps 2^-7). Per
    layer of the tiny Llama about 14 such roundings lie on the logits' path (q/k/v, attention, o, gate
    and up, SiLU × up, down: input, weight, output each), 3 layers and the output layer: n = 45.
    Independent roundings add in quadrature over the logits, so their relative L2 error is about
    √n·eps/2 (numerics.py's typical case); the bound allows 2√n·eps. A prefix set to zero (what a
    prefix lost on the way to the cache would give) moves the logits by far more, so the bound can fail."""
    lm, tok = load_causal_lm(str(tiny_lm))
    torch.manual_seed(0)
    prefix = PrefixTuner(PrefixConfig(prefix_length=3, init="random"), lm, tok).prefix_batch(len(PROMPTS), False)
    fp = _last_logits(lm, prefix)
    bf16 = for_decoding(copy.deepcopy(lm), "bf16")
    bound = 2 * math.sqrt(45) * eps(torch.bfloat16)
    for row in range(len(PROMPTS)):
        err = float((_last_logits(bf16, prefix)[row] - fp[row]).norm() / fp[row].norm())
        assert err <= bound, f"row {row}: bf16 logits {err:.3g} off fp32 (relative L2), bound {bound:.3g}"
    lost = PrefixBatch(torch.zeros_like(prefix.kv), prefix.mask)
    far = float((_last_logits(bf16, lost) - fp).norm() / fp.norm())
    assert far > bound, f"a zero prefix is only {far:.3g} off: the bound {bound:.3g} could not catch a lost prefix"


def test_precisions_refused_for_decoding():
    with pytest.raises(PrefixError, match="int8 is for the frozen pass of classifiers"):
        choose_decode_precision("int8", torch.device("cpu"))
    with pytest.raises(PrefixError, match="fp32, bf16, fp16"):
        for_decoding(torch.nn.Linear(2, 2), "int4")
    assert choose_decode_precision(None, torch.device("cpu"))[0] == "fp32"


def test_decoding_in_a_precision_slower_than_fp32_on_this_cpu_is_said(monkeypatch):
    """bf16 decoding is the choice for throughput where the CPU has bf16 instructions; on one without, its
    products ran ~60x slower than fp32's (an AVX2-only EPYC). The line says so, from a measurement (given here)."""
    from frozentune.extract import precision as P

    monkeypatch.setattr(P, "speed_vs_fp32", lambda p: {"bf16": 0.016, "fp16": 2.0}[p])
    _, slow = choose_decode_precision("bf16", torch.device("cpu"))
    assert slow.endswith("; on this CPU a matrix product in bf16 ran 62x slower than in fp32 (measured just now): "
                         "it will run slower, not faster; --precision fp32 is exact and faster here"), slow
    assert "slower" not in choose_decode_precision("fp16", torch.device("cpu"))[1]
    assert "slower" not in choose_decode_precision(None, torch.device("cpu"))[1]


def test_generate_and_eval_say_the_precision(prefix_model, tmp_path, shared_data):
    src = "name[Aromi], food[Italian]"
    fp32 = cli("generate", "--model", prefix_model, "--json", src, code=0)
    assert "decoding in fp32" in fp32.err
    bf16 = cli("generate", "--model", prefix_model, "--json", "--precision", "bf16", src, code=0)
    assert "decoding in bf16 (--precision bf16)" in bf16.err
    assert json.loads(bf16.out)["source"] == src
    cli("generate", "--model", prefix_model, "--precision", "int8", src, contains="invalid choice: 'int8'")
    e2e = head_of_files(shared_data / "e2e", tmp_path / "e2e", {"dev": 24, "test": 4})
    cli("eval", "--model", prefix_model, "--data", e2e, "--precision", "int8", contains="int8 is for the frozen pass")
    scored = cli("eval", "--model", prefix_model, "--data", e2e, "--precision", "bf16", code=0)
    assert json.loads(scored.out)["precision"] == "bf16"
