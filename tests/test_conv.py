"""Convolutional encoders, MLM pre-training and the `conv` method (tiny sizes: width 16–32, 1–3 layers)."""
import gzip
import json
import re

import numpy as np
import pytest
import torch

from frozentune import model as M
from frozentune.backbone import Backbone
from frozentune.cli import main
from frozentune.conv.encoder import (ARCHS, ConvError, Encoder, EncoderConfig, EncoderShape, load_tokenizer,
                                     parameter_counts, receptive_radius)
from frozentune.conv.layers import DilatedConv, DynamicConv, LightConv
from frozentune.conv.pretrain import (IGNORE, PretrainConfig, build_corpus, corpus_texts, find_checkpoint, mask_tokens,
                                      pretrain, read_checkpoint)
from frozentune.data import DataError
from frozentune.registry import MethodError, get_method, make_config
from frozentune.train import predict_logits
from numerics import ACTIVATION, assert_close, attention, dot, exact, ffn_block, linear, noise, norm, softmax

TINY = {"layers": 2, "dim": 16, "heads": 2, "kernel_size": 3, "ffn_dim": 32, "dropout": 0.0}


def tiny_encoder(arch: str, seed: int = 0, **over) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(EncoderConfig(**{**TINY, "arch": arch, **over}, max_length=64), vocab_size=100).eval()


def conv_ops(c: int, k: int) -> int:
    """One convolution output over c channels, k taps: the longest chain is DynamicConv's (predict
    the kernel from c inputs, softmax over k, sum of k taps); LightConv and DilatedConv do less."""
    return linear(c) + softmax(k) + dot(k)


def encoder_ops(c: EncoderConfig, tokens: int) -> int:
    """One Encoder forward: token + position embedding, then per layer the mixer (GLU in, the
    convolution or attention over `tokens`, projection out), its norm and residual, the FFN block; final norm."""
    inner = attention(tokens, c.dim // c.heads) if c.arch == "transformer" else conv_ops(c.dim, c.kernel_size)
    mixer = linear(c.dim) + ACTIVATION + inner + linear(c.dim)
    return 1 + c.layers * (mixer + norm(c.dim) + 1 + ffn_block(c.dim, c.ffn_dim)) + norm(c.dim)


def padded_input(B=2, T=9, C=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, requires_grad=True)
    mask = torch.arange(T)[None, :] < torch.tensor([T, T - 3])[:, None]  # (B, T), row 1 has 3 padding
    return x, mask


# ----------------------------------------------------------------------------- the convolutions
@pytest.mark.parametrize("conv", [LightConv(8, 2, 5), DynamicConv(8, 2, 5), DilatedConv(8, 3, 2), DilatedConv(8, 5, 3)],
                         ids=["light", "dynamic", "dilated-k3-r2", "dilated-k5-r3"])
def test_fast_equals_reference_values_and_gradients(conv):
    torch.manual_seed(0)
    x, mask = padded_input()
    params = [p for p in conv.parameters()]
    fast, ref = conv(x, mask), conv.reference(x, mask)
    assert fast.shape == x.shape
    B, T, C = x.shape
    k = conv.kernel_size
    assert_close(fast, ref, ops=conv_ops(C, k), what="values")  # conv1d / shifted sums vs loops: another order
    up = torch.randn_like(fast)  # an arbitrary upstream gradient
    g_fast = torch.autograd.grad((fast * up).sum(), [x, *params])
    g_ref = torch.autograd.grad((ref * up).sum(), [x, *params])
    # backward: through the forward chain, then a parameter's gradient sums over all B·T·C uses
    for name, a, b in zip(["x", *(n for n, _ in conv.named_parameters())], g_fast, g_ref):
        assert_close(a, b, ops=conv_ops(C, k) + softmax(k) + dot(B * T * C), what=f"gradient of {name}")


def test_softmax_kernels_sum_to_one():
    light, dyn = LightConv(8, 2, 5).eval(), DynamicConv(8, 2, 5).eval()
    x, _ = padded_input()
    w = light.kernel()
    assert w.shape == (2, 5) and (w > 0).all()
    assert_close(w.sum(-1), torch.ones(2), ops=softmax(5) + dot(5))
    wd = dyn.kernel(x)
    assert wd.shape == (2, 9, 2, 5) and (wd > 0).all()
    assert_close(wd.sum(-1), torch.ones(2, 9, 2), ops=linear(8) + softmax(5) + dot(5))


def test_padding_is_zeroed_before_the_convolution():
    """What sits at padding positions (here: huge values) never reaches a real position."""
    for conv in (LightConv(8, 2, 5), DynamicConv(8, 2, 5), DilatedConv(8, 3, 2)):
        x, mask = padded_input()
        dirty = x.detach().masked_fill(~mask[..., None], 1e6)
        real = mask[..., None].expand_as(x)
        exact(conv(dirty, mask)[real], conv(x.detach(), mask)[real],
              "padding is zeroed first: the convolution gets identical inputs, same kernel")


# ----------------------------------------------------------------------------- the encoder
@pytest.mark.parametrize("arch,over", [("light", {}), ("dynamic", {}), ("dilated", {}), ("dilated", {"layers": 3}),
                                       ("light", {"kernel_size": 5})])
def test_change_reaches_only_the_receptive_field(arch, over):
    enc = tiny_encoder(arch, **over)
    R = receptive_radius(enc.config)
    assert R == (enc.config.kernel_size // 2) * (sum(2 ** i for i in range(enc.config.layers)) if arch == "dilated" else enc.config.layers)
    T, t = 40, 20
    ids = torch.randint(5, 100, (1, T), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, t] = 4 if ids[0, t] != 4 else 3
    mask = torch.ones(1, T, dtype=torch.bool)
    with torch.no_grad():
        diff = (enc(ids, mask) - enc(changed, mask)).abs().amax(-1)[0]  # (T,)
    dist = (torch.arange(T) - t).abs()
    # exact both ways: a position the change cannot reach computes the same kernels (same shapes) on
    # identical inputs, so it is bitwise unchanged; a reached one moves by a real amount (≥ 1.5e-4 here,
    # ~600 ulps), so an exact 0 inside R means a dead tap and any difference beyond R a leak
    assert (diff[dist > R] == 0).all(), f"{arch}: positions beyond {R} changed: {diff[dist > R]}"
    assert (diff[dist <= R] > 0).all(), f"{arch}: positions within {R} did not all change: {diff[dist <= R]}"


def test_transformer_reaches_everywhere():
    enc = tiny_encoder("transformer")
    assert receptive_radius(enc.config) is None
    ids = torch.randint(5, 100, (1, 30), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 0] = 4 if ids[0, 0] != 4 else 3
    mask = torch.ones(1, 30, dtype=torch.bool)
    with torch.no_grad():
        out = enc(ids, mask)
        diff = (out - enc(changed, mask)).abs().amax(-1)[0]
    assert (diff > noise(out, ops=encoder_ops(enc.config, 30))).all()  # every position changed beyond rounding


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_does_not_change_real_positions(arch):
    enc = tiny_encoder(arch)
    g = torch.Generator().manual_seed(2)
    short, long_ = torch.randint(5, 100, (7,), generator=g), torch.randint(5, 100, (12,), generator=g)
    with torch.no_grad():
        alone = enc(short[None], torch.ones(1, 7, dtype=torch.bool))[0]  # (7, D)
        junk = torch.randint(5, 100, (5,), generator=g)  # padding ids do not matter, the mask does
        batch = torch.stack([torch.cat([short, junk]), long_])
        mask = torch.tensor([[True] * 7 + [False] * 5, [True] * 12])
        together = enc(batch, mask)[0, :7]
    assert_close(together, alone, ops=encoder_ops(enc.config, 12))  # batch of 2 vs 1, T 12 vs 7: other blocking


def test_parameter_counts_within_five_percent():
    for shape in (EncoderShape(), EncoderShape(**TINY)):
        counts = parameter_counts(shape)
        assert set(counts) == set(ARCHS)
        for kind in ("total", "non_embedding"):
            values = [c[kind] for c in counts.values()]
            assert max(values) <= 1.05 * min(values), f"{kind} parameter counts differ by more than 5%: {counts}"
    real = sum(p.numel() for p in tiny_encoder("dynamic").parameters())
    assert parameter_counts(EncoderShape(**TINY), vocab_size=100, max_length=64)["dynamic"]["total"] == real


def test_bad_encoder_options():
    with pytest.raises(ConvError, match="arch 'nope': choose one of light, dynamic, dilated, transformer"):
        EncoderConfig(arch="nope").validate()
    # each names the one option wrong as the command line spells it (they said "kernel_size 4", or one lumped
    # "layers, dim, heads and ffn_dim must be at least 1")
    with pytest.raises(ConvError, match="^--kernel-size 4: give an odd width"):
        EncoderConfig(kernel_size=4).validate()
    with pytest.raises(ConvError, match="^--heads 3: must divide --dim 16"):
        EncoderConfig(dim=16, heads=3).validate()
    with pytest.raises(ConvError, match="^--ffn-dim 0: must be at least 1$"):
        EncoderConfig(ffn_dim=0).validate()
    with pytest.raises(ConvError, match="^--dilation-cycle 0: must be at least 1$"):
        EncoderConfig(dilation_cycle=0).validate()
    with pytest.raises(ConvError, match="^--ffn-dim 100: .* give --ffn-dim 129 or more"):
        EncoderConfig(arch="transformer", ffn_dim=100).validate()
    with pytest.raises(ConvError, match="^--weight-dropout 1.0: give a value in"):
        EncoderConfig(weight_dropout=1.0).validate()
    enc = tiny_encoder("light")
    with pytest.raises(ConvError, match="position table has 64 rows"):
        enc(torch.ones(1, 65, dtype=torch.long), torch.ones(1, 65, dtype=torch.bool))


# ----------------------------------------------------------------------------- MLM
def test_mlm_masking_follows_80_10_10():
    g = torch.Generator().manual_seed(0)
    B, T, mask_id = 400, 500, 3
    ids = torch.randint(10, 1000, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2  # specials at both ends
    real = torch.arange(T)[None, :] < torch.randint(T // 2, T, (B, 1), generator=g)
    ids[~real] = 0
    eligible = real & (ids >= 10)
    replace = torch.arange(10, 1000)
    inputs, labels = mask_tokens(ids, eligible, mask_id, replace, 0.15, g)
    chosen = labels != IGNORE
    assert not chosen[~eligible].any(), "a special or padding token was chosen"
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])  # integer ids
    n = int(chosen.sum())
    # sampling, not rounding (seeded, so deterministic): ~1.5e5 eligible tokens, σ ≈ 9e-4, abs = 5σ
    assert n / int(eligible.sum()) == pytest.approx(0.15, abs=0.005)
    masked = (inputs[chosen] == mask_id).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    randomised = 1 - masked - kept
    # sampling: ~2.2e4 chosen tokens, σ ≈ 2.7e-3 (0.8) and 2e-3 (0.1); abs 0.01 = 3.7σ / 5σ
    assert (masked, kept, randomised) == (pytest.approx(0.8, abs=0.01), pytest.approx(0.1, abs=0.01), pytest.approx(0.1, abs=0.01))
    swapped = inputs[chosen & (inputs != mask_id) & (inputs != ids)]
    assert ((swapped >= 10) & (swapped < 1000)).all(), "random replacements come from the allowed ids"


def test_masking_always_predicts_something():
    ids = torch.tensor([[1, 50, 2]])
    for seed in range(20):
        _, labels = mask_tokens(ids, torch.tensor([[False, True, False]]), 3, torch.arange(10, 20), 0.15,
                                torch.Generator().manual_seed(seed))
        assert labels.tolist() == [[IGNORE, 50, IGNORE]]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, shared_data):
    """A small text file: one IMDB review (cut to 300 characters) per line."""
    path = tmp_path_factory.mktemp("corpus") / "reviews.txt"
    with open(shared_data / "imdb" / "train.jsonl") as f:
        lines = [json.loads(next(f))["text"][:300].replace("\n", " ") for _ in range(60)]
    path.write_text("\n".join(lines) + "\n")
    return path


ENC = {"arch": "dynamic", "layers": 1, "dim": 16, "heads": 2, "kernel_size": 3, "ffn_dim": 32, "max_length": 32}
RUN = {"batch_size": 4, "warmup_steps": 2, "checkpoint_every": 2, "log_every": 1, "lr": 1e-3, "device": "cpu"}


def quiet(_: str) -> None:
    pass


def test_pretrain_checkpoints_and_resume_equals_one_run(corpus_file, tmp_path):
    whole = pretrain(tmp_path / "whole", str(corpus_file), ENC, {**RUN, "steps": 5}, log=quiet)
    assert whole["step"] == 5 and whole["stopped_by"] == "steps"
    folder = find_checkpoint(tmp_path / "whole")
    assert folder.name == "step-0000005" and [p.name for p in (tmp_path / "whole").glob("step-*")] == [folder.name]
    assert not list((tmp_path / "whole").glob(".tmp-*"))
    curve = [json.loads(line) for line in (tmp_path / "whole" / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [1, 2, 3, 4, 5] and all(np.isfinite(r["loss"]) for r in curve)
    config = json.loads((folder / "config.json").read_text())
    assert config["step"] == 5 and config["encoder"]["arch"] == "dynamic" and config["corpus"]["texts"] == 60

    pretrain(tmp_path / "split", str(corpus_file), ENC, {**RUN, "steps": 3}, log=quiet)
    resumed = pretrain(tmp_path / "split", None, {}, {"steps": 5}, resume=True, log=quiet)
    assert resumed["step"] == 5
    _, a = read_checkpoint(tmp_path / "whole")
    _, b = read_checkpoint(tmp_path / "split")
    # exact: resuming restores weights, optimiser and RNG state, then runs the same kernels on the same batches
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resuming changed the run"
    again = [json.loads(line) for line in (tmp_path / "split" / "loss.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in again] == [r["loss"] for r in curve]  # exact, as above


def test_a_checkpoint_from_before_the_segment_embedding_resumes(corpus_file, tmp_path):
    """A checkpoint pre-trained before the encoder had a segment embedding loaded its weights (the embedding
    filled with zeros) but not its optimiser state (one parameter fewer): `--resume` was refused as "does not
    fit the run it describes; restore it", which no restoring could help. It now resumes: the embedding starts
    fresh, every other parameter's optimiser state continues."""
    from safetensors.torch import load_file, save_file

    from frozentune.conv.pretrain import FORMAT, OPTIMIZER, WEIGHTS, MaskedLM

    pretrain(tmp_path / "old", str(corpus_file), ENC, {**RUN, "steps": 3}, log=quiet)
    folder = find_checkpoint(tmp_path / "old")
    weights = load_file(folder / WEIGHTS)
    del weights["encoder.seg.weight"]  # what that version saved
    save_file(weights, folder / WEIGHTS, metadata={"format": FORMAT})
    extra = torch.load(folder / OPTIMIZER, weights_only=True)
    fresh = MaskedLM(Encoder(EncoderConfig(**ENC), len(load_tokenizer())))
    gone = [i for i, p in enumerate(p for p in fresh.parameters() if p.ndim >= 2) if p is fresh.encoder.seg.weight]
    assert len(gone) == 1  # in the first group (matrices), numbered from 0 across the groups
    shift = lambda i: i - (i > gone[0])  # noqa: E731
    opt = extra["optimizer"]
    kept = {i: st for i, st in opt["state"].items() if i != gone[0]}
    opt["state"] = {shift(i): st for i, st in kept.items()}
    for group in opt["param_groups"]:
        group["params"] = [shift(i) for i in group["params"] if i != gone[0]]
    torch.save(extra, folder / OPTIMIZER)
    said = []
    resumed = pretrain(tmp_path / "old", None, {}, {"steps": 5}, resume=True, log=said.append)
    assert resumed["step"] == 5 and np.isfinite(resumed["final_loss"])
    assert any("before encoder.seg.weight existed" in s and "fresh optimiser state" in s for s in said), said


def test_a_corpus_given_by_a_relative_path_resumes_from_anywhere(corpus_file, tmp_path, monkeypatch):
    """The corpus path was saved as given: resuming from another folder could not find it, and naming the
    same file by another path was refused as another corpus."""
    monkeypatch.chdir(corpus_file.parent)
    pretrain(tmp_path / "rel", corpus_file.name, ENC, {**RUN, "steps": 2}, log=quiet)
    monkeypatch.chdir(tmp_path)
    assert pretrain(tmp_path / "rel", None, {}, {"steps": 3}, resume=True, log=quiet)["step"] == 3
    assert pretrain(tmp_path / "rel", str(corpus_file), {}, {"steps": 4}, resume=True, log=quiet)["step"] == 4


def test_resume_refuses_an_edited_corpus_of_as_many_chunks(tmp_path):
    """Only the number of chunks was compared: a corpus edited in place resumed silently on other texts. A
    checkpoint written before the digest was recorded is still checked by the count alone, and resumes."""
    corpus = tmp_path / "one.txt"
    corpus.write_text("just one line of text here\n")
    out = tmp_path / "p"
    pretrain(out, str(corpus), ENC, {**RUN, "steps": 2}, log=quiet)
    config_file = find_checkpoint(out) / "config.json"
    assert len(json.loads(config_file.read_text())["corpus"]["sha256"]) == 64
    corpus.write_text("just one lone of text here\n")
    with pytest.raises(ConvError, match="the corpus .*one.txt changed since the checkpoint: as many chunks as then "
                                        "\\(1\\), but other tokens .*; resume with the same corpus"):
        pretrain(out, None, {}, {"steps": 4}, resume=True, log=quiet)
    assert find_checkpoint(out).name == "step-0000002"
    config = json.loads(config_file.read_text())
    del config["corpus"]["sha256"]  # as written before the digest was recorded
    config_file.write_text(json.dumps(config))
    assert pretrain(out, None, {}, {"steps": 4}, resume=True, log=quiet)["step"] == 4


def test_resume_from_a_corpus_that_moved(tmp_path):
    """The corpus file moved: --resume read the saved path (no such file) and refused another --corpus as a
    changed setting, a dead end. Now another path resumes where its tokens are the checkpoint's (the digest),
    the missing file's error says so, and a checkpoint without the digest cannot be moved."""
    corpus = tmp_path / "a.txt"
    corpus.write_text("one line of text here\nand a second line\n")
    out = tmp_path / "p"
    pretrain(out, str(corpus), ENC, {**RUN, "steps": 2}, log=quiet)
    moved = tmp_path / "elsewhere" / "b.txt"
    moved.parent.mkdir()
    corpus.rename(moved)
    with pytest.raises(DataError, match=r"a\.txt: no such file or folder.*\. If the corpus moved, resume with "
                                        r"--corpus NEW_PATH: its tokens are checked against the checkpoint's "
                                        r"\(from Python: corpus= for --corpus\)$"):
        pretrain(out, None, {}, {"steps": 3}, resume=True, log=quiet)
    assert pretrain(out, str(moved), {}, {"steps": 3}, resume=True, log=quiet)["step"] == 3
    assert json.loads((find_checkpoint(out) / "config.json").read_text())["corpus"]["spec"] == str(moved.resolve())
    edited = tmp_path / "c.txt"
    edited.write_text("one line of text there\nand a second line\n")
    with pytest.raises(ConvError, match="c.txt changed since the checkpoint: as many chunks as then"):
        pretrain(out, str(edited), {}, {"steps": 4}, resume=True, log=quiet)
    config_file = find_checkpoint(out) / "config.json"
    config = json.loads(config_file.read_text())
    del config["corpus"]["sha256"]  # as written before the digest was recorded
    config_file.write_text(json.dumps(config))
    with pytest.raises(ConvError, match=r"written before frozentune recorded a digest .* resume with --corpus .*b\.txt"):
        pretrain(out, str(tmp_path / "c.txt"), {}, {"steps": 4}, resume=True, log=quiet)


def test_pretrain_time_budget_and_refusals(corpus_file, tmp_path):
    out = tmp_path / "p"
    r = pretrain(out, str(corpus_file), ENC, {**RUN, "minutes": 1e-4}, log=quiet)
    assert r["stopped_by"] == "minutes" and r["step"] >= 1
    with pytest.raises(ConvError, match="already holds a pre-training run .* add --resume"):
        pretrain(out, str(corpus_file), ENC, {**RUN, "steps": 2}, log=quiet)
    with pytest.raises(ConvError, match="arch 'light' \\(saved: 'dynamic'\\)"):
        pretrain(out, None, {"arch": "light"}, {"steps": 9}, resume=True, log=quiet)
    with pytest.raises(ConvError, match="nothing to resume"):
        pretrain(tmp_path / "empty", str(corpus_file), ENC, {"steps": 2}, resume=True, log=quiet)
    with pytest.raises(ConvError, match="give a budget"):
        pretrain(tmp_path / "q", str(corpus_file), ENC, {}, log=quiet)
    with pytest.raises(ConvError, match="cannot be negative"):  # it said "give a budget" as if none was given
        pretrain(tmp_path / "q", str(corpus_file), ENC, {"steps": -5}, log=quiet)
    with pytest.raises(ConvError, match="no such folder"):  # it said the missing folder "is not a checkpoint"
        read_checkpoint(tmp_path / "nope")
    with pytest.raises(DataError, match="no such file"):
        pretrain(tmp_path / "q", str(tmp_path / "missing.txt"), ENC, {"steps": 2}, log=quiet)
    busy = tmp_path / "a-saved-model"  # a new run wrote its checkpoint and result.json into any folder
    busy.mkdir()
    (busy / "result.json").write_text("{}")
    with pytest.raises(ConvError, match="is not empty .* holds no pre-training run"):
        pretrain(busy, str(corpus_file), ENC, {"steps": 2}, log=quiet)
    assert [p.name for p in busy.iterdir()] == ["result.json"] and (busy / "result.json").read_text() == "{}"
    # a resumed run whose budget is already spent: said, nothing rewritten (it said "steps budget spent" and
    # rewrote result.json with the smaller budget)
    before = (out / "result.json").read_text()
    with pytest.raises(ConvError, match=f"is at step {r['step']} .* already past --minutes 1e-05; give a larger budget"):
        pretrain(out, None, {}, {"minutes": 1e-5}, resume=True, log=quiet)
    # only the budget spent is named (it said "already past --steps 1000000000 --minutes 1e-05")
    with pytest.raises(ConvError, match=f"is at step {r['step']} .* already past --minutes 1e-05; give") as e:
        pretrain(out, None, {}, {"steps": 10 ** 9, "minutes": 1e-5}, resume=True, log=quiet)
    assert "--steps" not in str(e.value)
    assert (out / "result.json").read_text() == before


def test_pretrain_stopped_before_its_first_checkpoint_starts_again(corpus_file, tmp_path):
    """A run interrupted before its first checkpoint left only loss.jsonl: the same command was then refused
    ("not empty ... holds no pre-training run") and --resume found nothing to resume."""
    out = tmp_path / "p"
    out.mkdir()
    (out / "loss.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    (out / ".tmp-step-0000002").mkdir()  # a checkpoint being written when it stopped
    r = pretrain(out, str(corpus_file), ENC, {**RUN, "steps": 2}, log=quiet)
    assert r["step"] == 2 and len((out / "loss.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(encoder="x"), 'encoder is not an object of EncoderConfig\'s fields (it holds "x")'),
    (lambda c: c["encoder"].update(dim="32"), "encoder is not an object of EncoderConfig's fields (dim='32': a whole"),
    (lambda c: c["run"].update(lr=[1]), "run is not an object of PretrainConfig's fields (lr=[1]: a number"),
    (lambda c: c.pop("seconds"), "seconds is not a number, 0 or more"),
    (lambda c: c["corpus"].pop("chunks"), "corpus is not an object of the corpus read"),
    (lambda c: c.clear() or c.update(format="frozentune-mlm/1", x=1), "encoder is not an object"),
], ids=["encoder", "dim", "lr", "seconds", "chunks", "bare"])
def test_a_hand_edited_checkpoint_is_named_not_a_traceback(corpus_file, tmp_path, edit, says):
    """A checkpoint's config.json edited by hand ended in a KeyError ('run', 'seconds', 'tokens_seen') or an
    AttributeError in --resume and --init (found by a fuzz of it); a config.json that is not an object, too."""
    out = tmp_path / "p"
    pretrain(out, str(corpus_file), ENC, {**RUN, "steps": 1}, log=quiet)
    config_file = find_checkpoint(out) / "config.json"
    config = json.loads(config_file.read_text())
    edit(config)
    config_file.write_text(json.dumps(config))
    for run in (lambda: pretrain(out, None, {}, {"steps": 2}, resume=True, log=quiet),
                lambda: read_checkpoint(out)):
        with pytest.raises(ConvError, match=re.escape(f"{config_file}: {says}")):
            run()
    config_file.write_text("[1, 2]")  # JSON, but not an object: an AttributeError
    with pytest.raises(ConvError, match="is not a pre-training checkpoint"):
        read_checkpoint(out)


@pytest.mark.parametrize("latest", ["../other/step-0000001", "/tmp", "step-1\nx", b"\xff\xfe", ""])
def test_latest_names_a_step_folder_beside_it(corpus_file, tmp_path, latest):
    """`latest` holding a path led --resume and --init to another run's checkpoint (one at ../other was resumed, and
    written on, as this one's); bytes that are not text raised a UnicodeDecodeError. Refused, naming the file."""
    other, out = tmp_path / "other", tmp_path / "p"
    pretrain(other, str(corpus_file), ENC, {**RUN, "steps": 1}, log=quiet)
    pretrain(out, str(corpus_file), ENC, {**RUN, "steps": 1}, log=quiet)
    before = {p.name: p.read_bytes() for p in sorted(other.rglob("*")) if p.is_file()}
    (out / "latest").write_bytes(latest if isinstance(latest, bytes) else latest.encode())
    for run in (lambda: pretrain(out, None, {}, {"steps": 2}, resume=True, log=quiet), lambda: read_checkpoint(out)):
        with pytest.raises(ConvError, match=re.escape(f"{out / 'latest'}: holds ") + ".*not the name of a step-N folder"):
            run()
    assert {p.name: p.read_bytes() for p in sorted(other.rglob("*")) if p.is_file()} == before
    (out / "latest").write_text("step-0000001\n")  # as written, with a line end: read
    assert read_checkpoint(out)[0]["step"] == 1


# ----------------------------------------------------------------------------- the conv method
def test_init_loads_the_pretrained_encoder(corpus_file, tmp_path):
    pretrain(tmp_path / "p", str(corpus_file), ENC, {**RUN, "steps": 2}, log=quiet)
    shape = {k: v for k, v in ENC.items() if k != "max_length"}
    build = get_method("conv").encoder
    bb = build(make_config("conv", {**shape, "init": str(tmp_path / "p")}), 16)
    _, state = read_checkpoint(tmp_path / "p")
    exact(bb.model.pos.weight, state["encoder.pos.weight"][:16], "weights copied from the checkpoint")
    exact(bb.model.layers[0].mixer.conv.predict.weight, state["encoder.layers.0.mixer.conv.predict.weight"],
          "weights copied from the checkpoint")
    with pytest.raises(ConvError, match="pre-trained as `--arch dynamic .*arch light \\(checkpoint: dynamic\\)"):
        build(make_config("conv", {**shape, "arch": "light", "init": str(tmp_path / "p")}), 16)
    with pytest.raises(ConvError, match="positions for 32 tokens; fine-tune with --max-length 32 or less"):
        build(make_config("conv", {**shape, "init": str(tmp_path / "p")}), 64)
    with pytest.raises(ConvError, match="is not a pre-training checkpoint"):
        build(make_config("conv", {**shape, "init": str(tmp_path)}), 16)


def test_the_truncation_note_gives_the_init_checkpoints_length(corpus_file, trec_slice, tmp_path, capsys):
    """The note told conv users "this backbone reads up to 512 tokens" (the MiniLM tokenizer's limit): with --init a
    --max-length past the checkpoint's positions is refused, and from scratch nothing limits it."""
    sizes = ["--arch", "light", "--layers", 1, "--dim", 16, "--heads", 2, "--kernel-size", 3, "--ffn-dim", 32]
    pretrain(tmp_path / "p", str(corpus_file), ENC | {"arch": "light"}, {**RUN, "steps": 1}, log=quiet)
    shape = {k: v for k, v in ENC.items() if k != "max_length"} | {"arch": "light"}
    build = get_method("conv").encoder
    assert build(make_config("conv", {**shape, "init": str(tmp_path / "p")}), 8).longest_input == 32
    assert build(make_config("conv", shape), 8).longest_input is None
    train = ["train", "--method", "conv", *sizes, "--data", trec_slice, "--max-length", 8, "--steps", 1, "--device", "cpu"]
    code, stdout, err = run(capsys, *train, "--init", tmp_path / "p")
    assert code == 0, err
    note = next(line for line in stdout.splitlines() if line.startswith("data: ") and "reached --max-length" in line)
    assert note.endswith("; this backbone reads up to 32 tokens: --max-length 32 reads more of each (each training "
                         "step takes longer)"), note
    code, stdout, err = run(capsys, *train)  # from scratch: how many were cut, and no limit made up
    assert code == 0, err
    note = next(line for line in stdout.splitlines() if line.startswith("data: ") and "reached --max-length" in line)
    assert note.endswith("longer ones were truncated to it"), note


def test_conv_and_other_backbones_do_not_mix(tiny_bert):
    bert = Backbone.load(str(tiny_bert), max_length=16)
    with pytest.raises(MethodError, match="trains an encoder of its own"):
        M.build_classifier("conv", bert, ["a", "b"])
    conv = get_method("conv").encoder(make_config("conv", TINY), 16)
    with pytest.raises(MethodError, match="is the encoder of method 'conv'"):
        M.build_classifier("probe", conv, ["a", "b"])
    with pytest.raises(MethodError, match="arch='nope'; choose one of light"):
        make_config("conv", {"arch": "nope"})
    with pytest.raises(MethodError, match="--no-train-backbone does not apply"):
        make_config("conv", {"train_backbone": False})


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_pretrain_finetune_predict_round_trip(corpus_file, trec_slice, tmp_path, capsys):
    sizes = ["--arch", "light", "--layers", 1, "--dim", 16, "--heads", 2, "--kernel-size", 3, "--ffn-dim", 32]
    ckpt, out = tmp_path / "ckpt", tmp_path / "model"
    code, stdout, err = run(capsys, "pretrain", "--corpus", corpus_file, "--output", ckpt, *sizes, "--max-length", 32,
                            "--steps", 3, "--batch-size", 4, "--log-every", 1, "--device", "cpu")
    assert code == 0, err
    assert "step      3  loss" in stdout and (ckpt / "latest").is_file()
    assert stdout.startswith("device: cpu (")  # the device line train prints
    code, stdout, err = run(capsys, "train", "--method", "conv", *sizes, "--init", ckpt, "--data", trec_slice,
                            "--max-length", 32, "--epochs", 2, "--output", out, "--quiet")
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    assert result["config"]["method_options"]["init"] == str(ckpt) and result["config"]["backbone"]["max_length"] == 32
    assert result["trainable_params"] == sum(p.numel() for p in M.load(out).parameters())

    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", tmp_path / "unused")
    assert code == 0, err
    assert json.loads(stdout)["metrics"] == result["metrics"]  # exact: the same model, kernels and test batches
    assert "cache: --cache-dir not used: method 'conv' runs its backbone on every batch" in err  # was silent
    assert not (tmp_path / "unused").exists()
    # conv's encoder runs in fp32: --precision was said to be used ("precision: bf16 (as asked)") and ignored
    code, _, err = run(capsys, "train", "--method", "conv", *sizes, "--data", trec_slice, "--max-length", 32,
                       "--precision", "bf16", "--output", tmp_path / "m2", "--quiet")
    assert code == 2 and "--precision bf16: method 'conv' trains or steers the backbone" in err, err
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--precision", "bf16")
    assert code == 0 and "precision: fp32 (method 'conv' runs its backbone itself" in err and "as asked" not in err, err
    assert json.loads(stdout)["metrics"] == result["metrics"] and json.loads(stdout)["precision"] == "fp32"
    from frozentune.data import load_classification
    test = load_classification(str(trec_slice)).test
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(test.texts) + "\n")
    code, stdout, err = run(capsys, "predict", "--model", out, "--input", texts)
    assert code == 0, err
    model = M.load(out)
    src = M.LiveSource(model.backbone_ref.tokenize(test.texts), model.backbone_ref.pad_id())
    expected = [model.labels[i] for i in predict_logits(model, src).argmax(1)]
    assert [json.loads(line)["label"] for line in stdout.splitlines()] == expected


def test_pretrain_device_is_auto_and_said(corpus_file, tmp_path, capsys, monkeypatch):
    """pretrain defaulted to --device cpu where train, predict and serve take auto, and never said the device."""
    import frozentune.extract.device as D

    assert PretrainConfig().device == "auto"
    monkeypatch.setattr(D, "_cuda_count", lambda: 0)  # auto finds no GPU here, whatever the machine has
    monkeypatch.setattr(D, "_mps", lambda: False)
    code, stdout, err = run(capsys, "pretrain", "--corpus", corpus_file, "--output", tmp_path / "p", "--arch", "light",
                            "--layers", 1, "--dim", 16, "--heads", 2, "--ffn-dim", 32, "--max-length", 16, "--steps", 1)
    assert code == 0, err
    assert stdout.splitlines()[0].startswith("device: auto → cpu (no GPU found; "), stdout
    assert json.loads((tmp_path / "p" / "result.json").read_text())["run"]["device"] == "auto"


def interrupted_at(step: int, module, monkeypatch) -> None:
    """`module.shared_step` raises KeyboardInterrupt (Ctrl-C) at its `step`-th call."""
    real, calls = module.shared_step, []

    def step_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "shared_step", step_then_interrupt)


def test_an_interrupt_says_what_was_kept(corpus_file, trec_slice, tmp_path, capsys, monkeypatch):
    """Ctrl-C in pretrain said "keeps its last complete checkpoint, if one was written" where it knew whether one
    was; in train --method conv it spoke of cache entries kept for a rerun, where conv builds no cache."""
    import importlib

    P, T = (importlib.import_module(f"frozentune.{m}") for m in ("conv.pretrain", "train"))  # (names of functions too)

    sizes = ["--arch", "light", "--layers", 1, "--dim", 16, "--heads", 2, "--ffn-dim", 32, "--max-length", 16]
    args = ["pretrain", "--corpus", corpus_file, "--output", tmp_path / "p", *sizes, "--steps", 4,
            "--checkpoint-every", 2, "--device", "cpu"]
    interrupted_at(2, P, monkeypatch)
    code, _, err = run(capsys, *args)
    assert code == 130 and err.strip().endswith("interrupted by SIGINT; no checkpoint was written yet; the same "
                                                "command starts again"), err
    interrupted_at(4, P, monkeypatch)  # the same command: it starts again, and stops after its step-2 checkpoint
    code, _, err = run(capsys, *args)
    assert code == 130 and err.strip().endswith(f"interrupted by SIGINT; {tmp_path / 'p'} keeps its last complete "
                                                f"checkpoint (step-0000002): --resume continues from it"), err
    out = tmp_path / "m"
    interrupted_at(1, T, monkeypatch)
    code, _, err = run(capsys, "train", "--method", "conv", *sizes, "--data", trec_slice, "--output", out, "--quiet",
                       "--device", "cpu")
    assert code == 130 and err.strip().endswith("interrupted by SIGINT; the output folder is as it was and nothing "
                                                "trained is kept (method 'conv' runs its backbone on every batch, so "
                                                "no feature cache is built)"), err
    assert not out.exists()


@pytest.mark.parametrize("argv,needle", [
    (["pretrain", "--corpus", "/no/such/corpus.txt", "--output", "{tmp}/o", "--steps", "1"], "no such file"),
    (["pretrain", "--output", "{tmp}/o", "--steps", "1"], "give --corpus"),
    (["pretrain", "--corpus", "{unk}", "--output", "{tmp}/o", "--steps", "1"], "no tokens the tokenizer keeps"),
    (["pretrain", "--corpus", "imdb", "--output", "{tmp}/o"], "give a budget"),
    # each of these was a traceback, or (nan minutes) a run that never ended, or accepted
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--minutes", "nan"], "--minutes nan: give a finite number"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--lr", "nan"], "--lr nan: give a finite"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--lr", "-1"], "--lr -1.0: give a learning rate above 0"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--seed", "-1"], "--seed -1: give a whole number of 0"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--weight-decay", "-1"], "--weight-decay -1.0"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--max-grad-norm", "-1"], "--max-grad-norm -1.0"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--max-length", "2"], "give at least 3"),
    # pre-training's minimum, where the encoder's (2) was said first; then one option named, as typed
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--max-length", "0"],
     "--max-length 0: a pre-training chunk holds [CLS], [SEP] and at least one word piece; give at least 3"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--batch-size", "0"],
     "--batch-size 0: must be at least 1"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--checkpoint-every", "0"],
     "--checkpoint-every 0: must be at least 1"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--warmup-steps", "-1"],
     "--warmup-steps -1: must be at least 0"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--mask-prob", "1"],
     "--mask-prob 1.0: give a fraction in (0, 1)"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--kernel-size", "4"],
     "--kernel-size 4: give an odd width"),
    (["train", "--method", "conv", "--kernel-size", "4", "--data", "{trec}"], "--kernel-size 4: give an odd width"),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--device", "foo"], "--device 'foo': give auto"),
    # read as --data reads files (each was a traceback, or a text made of a null / a number)
    (["pretrain", "--corpus", "{tmp}/latin1.txt", "--output", "{tmp}/o", "--steps", "1"],
     "latin1.txt:2: not UTF-8 text (byte 0xe9 at byte offset 10)"),
    (["pretrain", "--corpus", "{tmp}/corpus.txt.gz", "--output", "{tmp}/o", "--steps", "1"],
     "a compressed file is not read: decompress it first, e.g. gunzip -k corpus.txt.gz"),
    (["pretrain", "--corpus", "{tmp}/numbers.jsonl", "--output", "{tmp}/o", "--steps", "1"],
     "numbers.jsonl:3: field 'text' holds a number, not text (42)"),
    (["pretrain", "--corpus", "{tmp}/strings.json", "--output", "{tmp}/o", "--steps", "1"],
     'expected an object in the array, got str (a string). Write each record as an object'),
    (["pretrain", "--corpus", "{corpus}", "--output", "{tmp}/o", "--steps", "1", "--text-field", "body"],
     "--text-field body: "),
    (["train", "--method", "conv", "--init", "{tmp}", "--data", "{trec}"], "is not a pre-training checkpoint"),
    (["train", "--method", "conv", "--backbone", "bert-base-uncased", "--data", "{trec}"],
     "--backbone does not apply (it chooses a frozen backbone)"),
    (["train", "--method", "conv", "--layer-combine", "concat", "--trust-remote-code", "--data", "{trec}"],
     "--layer-combine, --trust-remote-code do not apply (they choose a frozen backbone)"),  # were ignored
])
def test_bad_input_messages(capsys, tmp_path, trec_slice, corpus_file, argv, needle):
    unk = tmp_path / "unknown.txt"  # text, but only characters MiniLM's tokenizer reads as [UNK]
    unk.write_text("\u2603\u2603\n\u2603\n")
    (tmp_path / "latin1.txt").write_bytes(b"a line\ncaf\xe9\n")
    (tmp_path / "corpus.txt.gz").write_bytes(gzip.compress(b"a line\n"))
    (tmp_path / "numbers.jsonl").write_text('{"text": "a line"}\n{"text": ""}\n{"text": 42}\n')
    (tmp_path / "strings.json").write_text('["a line", "another"]')
    code, _, err = run(capsys, *[a.format(tmp=tmp_path, trec=trec_slice, unk=unk, corpus=corpus_file) for a in argv])
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()  # refused before any work, and before the output folder is made


def test_a_corpus_is_read_as_data_is(tmp_path):
    """A folder of split files is its train file, as --data reads it; blank rows, empty texts and a
    byte-order mark are not texts; every format gives the same texts."""
    texts = ["first text", "second, with a comma", "third"]
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:2]) + '{"text": " "}\n'
                                        + json.dumps({"text": texts[2]}) + "\n")
    (folder / "test.jsonl").write_text('{"text": "not read"}\n')
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"\xef\xbb\xbf" + "\n\n".join(texts).encode() + b"\n")
    csv = tmp_path / "c.csv"
    csv.write_text('text\n' + "\n".join(f'"{t}"' for t in texts) + "\n\n")
    for corpus in (folder, plain, csv):
        assert corpus_texts(str(corpus))[2] == texts, corpus
    assert corpus_texts(str(folder))[:2] == ("set", folder / "train.jsonl")


@pytest.mark.parametrize("command", [["pretrain", "--corpus", "imdb", "--output", "o", "--steps", "1"],
                                     ["train", "--method", "conv", "--data", "trec"]])
def test_unknown_arch_is_refused_by_the_parser(capsys, command):
    with pytest.raises(SystemExit):
        main([*command, "--arch", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_tokenizer_is_minilm():
    tok = load_tokenizer()
    assert tok.is_fast and len(tok) == 30522 and tok.mask_token == "[MASK]"


def test_typed_special_tokens_are_read_as_text(tmp_path):
    """A corpus line or a text holding "[MASK]" / "[SEP]" / "[CLS]" gives those characters' pieces, never
    the special ids: inside a chunk only the [CLS] first and the [SEP] last are special."""
    tok = load_tokenizer()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the [MASK] sat on the [SEP] mat [CLS] [PAD] [unk]\nplain words here\n")
    chunks = build_corpus(str(corpus), 32, tok).chunks
    special = set(tok.all_special_ids)
    assert len(chunks) == 2
    for c in chunks:
        assert c[0] == tok.cls_token_id and c[-1] == tok.sep_token_id
        assert not special & set(c[1:-1].tolist())
    assert tok.convert_ids_to_tokens(chunks[0][1:4].tolist()) == ["the", "[", "mask"]
