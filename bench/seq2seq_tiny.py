"""Encoder-decoder prefix-tuning on tiny models (issue 19's CPU figures; no BART/T5 weights can be
downloaded here, so the LMs are built from a config and pre-trained in this script).

task  — does a prefix learn a task through all three attention kinds? A tiny BART (and T5) is first
        trained from scratch, whole, on two instructed tasks over random symbol strings:
        "s3 s9 s1 copy" → "s3 s9 s1" and "s3 s9 s1 reverse" → "s1 s9 s3" (the instruction last, so
        a bare string keeps the positions its symbols had in training). It is then frozen and
        saved as a Hugging Face folder, and `frozentune train --method prefix` (the CLI, as a user
        runs it) trains a prefix on *bare* strings → their reversal: the instruction is gone and the
        prefix must take its place. Direct and MLP-reparameterised prefixes are both run, and the
        three kinds one at a time (encoder / decoder / cross only: the others held at zero length is
        not possible through the CLI, so that ablation runs through the library with the same loop).
        Exact match on 500 held-out strings; before training (no prefix) for reference.
sizes — saved prefix numbers and share of the model for BART-base/large and T5-small/base (from their
        published config shapes) and the tiny models.
mixed — throughput of one batch of 16 requests each with its own prefix, against one shared prefix
        and against the 16 one after another (batch of 1), on the tiny BART; fixed output length,
        median of interleaved repeats (as bench/prefix_mixed.py for SmolLM2).

  python bench/seq2seq_tiny.py --part sizes,task,mixed --threads 1   # writes bench/results/seq2seq-tiny.json (--out, --runs: elsewhere)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from frozentune.backbone import pad

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RUNS = HERE / "runs" / "seq2seq-tiny"
SYMBOLS = [f"s{i}" for i in range(16)]
WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", *SYMBOLS, "copy", "reverse"]
PAD, BOS, EOS = 0, 1, 2


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")


def build(arch: str, seed: int):
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    if arch == "bart":
        cfg = BartConfig(vocab_size=len(WORDS), d_model=64, encoder_layers=2, decoder_layers=2,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                         decoder_ffn_dim=256, max_position_embeddings=32, pad_token_id=PAD, bos_token_id=BOS,
                         eos_token_id=EOS, decoder_start_token_id=EOS, forced_eos_token_id=None,
                         dropout=0.0, attention_dropout=0.0)
        return BartForConditionalGeneration(cfg)
    cfg = T5Config(vocab_size=len(WORDS), d_model=64, d_kv=16, d_ff=256, num_layers=2, num_decoder_layers=2,
                   num_heads=4, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, dropout_rate=0.0)
    return T5ForConditionalGeneration(cfg)


def strings(n: int, rng: np.random.Generator, lo: int = 3, hi: int = 8) -> list[list[str]]:
    return [list(rng.choice(SYMBOLS, rng.integers(lo, hi + 1))) for _ in range(n)]


def pretrain(arch: str, seed: int, steps: int, log) -> tuple[object, dict]:
    """The whole model trained on instructed copy / reverse; returns it (eval mode) and its held-out exact match."""
    model, rng = build(arch, seed), np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        xs = strings(64, rng)
        tasks = rng.integers(0, 2, len(xs))
        src = [[WORDS.index(s) for s in x] + [WORDS.index(["copy", "reverse"][t]), EOS] for x, t in zip(xs, tasks)]
        tgt = [[WORDS.index(s) for s in (x[::-1] if t else x)] + [EOS] for x, t in zip(xs, tasks)]
        (ids, mask), (labels, _) = pad(src, PAD), pad(tgt, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0:
            log(f"  pretrain {arch} step {step} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)")
    model.eval()
    test = strings(500, np.random.default_rng(seed + 1000))
    scores = {task: exact_match(model, [x + [task] for x in test], [x[::-1] if task == "reverse" else x for x in test])
              for task in ("copy", "reverse")}
    scores["bare → reverse (no prefix)"] = exact_match(model, test, [x[::-1] for x in test])
    scores["bare → copy (no prefix)"] = exact_match(model, test, test)
    return model, {"steps": steps, "seconds": time.perf_counter() - t0, "exact_match": scores}


@torch.no_grad()
def exact_match(model, sources: list[list[str]], targets: list[list[str]], tuner=None) -> float:
    """Percent of greedy outputs equal to the target (through the tuner's prefixes when given)."""
    src = [[WORDS.index(s) for s in x] + [EOS] for x in sources]
    if tuner is not None:
        out = tuner.generate(src, max_new_tokens=12)
    else:
        ids, mask = pad(src, PAD)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                             num_beams=1, pad_token_id=PAD, eos_token_id=EOS)
        out = [r[:r.index(EOS)] if EOS in r else r for r in gen[:, 1:].tolist()]
    return 100.0 * float(np.mean([[WORDS[i] for i in o] == t for o, t in zip(out, targets)]))


def write_pairs(folder: Path, seed: int, n_train: int) -> Path:
    """train / validation / test .jsonl of bare strings → their reversal."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 7)
    for split, n in (("train", n_train), ("validation", 200), ("test", 500)):
        xs = strings(n, rng if split != "test" else np.random.default_rng(seed + 1000))
        with open(folder / f"{split}.jsonl", "w") as f:
            for x in xs:
                f.write(json.dumps({"source": " ".join(x), "target": " ".join(x[::-1])}) + "\n")
    return folder


def cli_run(lm_dir: Path, data: Path, out: Path, extra: list[str], log) -> dict:
    """`frozentune train --method prefix` on the pairs; exact match from its generations.jsonl."""
    from frozentune.cli import main

    argv = ["train", "--method", "prefix", "--data", str(data), "--backbone", str(lm_dir), "--output", str(out),
            "--overwrite", "--num-beams", "1", "--max-new-tokens", "12", "--seed", "0", *extra]
    log("  frozentune " + " ".join(argv))
    assert main(argv) == 0
    r = json.loads((out / "result.json").read_text())
    gens = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    em = 100.0 * float(np.mean([g["output"] == g["refs"][0] for g in gens]))
    return {"argv": argv, "exact_match": em, "train_seconds": r["train_seconds"], "best_epoch": r["best_epoch"],
            "trainable_params": r["trainable_params"], "saved_params": r["saved_params"],
            "backbone_params": r["backbone_params"], "val_loss": r["validation"]["loss"]}


def one_kind(lm_dir: Path, data: Path, kind: str, epochs: int, log) -> dict:
    """An MLP-reparameterised prefix on one attention kind only (the other two at zero length), trained by
    the CLI's loop with its options (lr 1e-3, 10 positions)."""
    from frozentune.generation.run import fit_generation, load_generation_splits
    from frozentune.backbone import load_seq2seq_lm
    from frozentune.generation.prefix import PrefixConfig
    from frozentune.generation.seq2seq import Seq2SeqPrefixTuner
    from frozentune.train import TrainConfig

    lm, tok = load_seq2seq_lm(str(lm_dir))
    torch.manual_seed(0)
    tuner = Seq2SeqPrefixTuner(PrefixConfig(prefix_length=10, reparam=True), lm, tok, str(lm_dir))
    for other in set(tuner.encoders) - {kind}:
        del tuner.encoders[other]
    def only(train: bool = False) -> dict:
        mine = tuner.encoders[kind]() if train else tuner.encoders[kind].materialize()
        zero = {k: torch.zeros(s.tensor_shape(0)) for k, s in tuner.shapes.items() if k != kind}
        return {kind: mine, **zero}

    tuner.prefixes = only  # type: ignore[method-assign]
    splits = load_generation_splits(str(data), 0, None, 200, None)
    t0 = time.perf_counter()
    fit_generation(tuner, tok, splits, TrainConfig(lr=1e-3, epochs=epochs, batch_size=16, patience=5, seed=0,
                                                   eval_batch_size=32), log)
    test = [ex.source.split() for ex in splits.test]
    em = exact_match(lm, test, [x[::-1] for x in test], tuner)
    return {"kind": kind, "exact_match": em, "train_seconds": time.perf_counter() - t0}


def task(a, log) -> dict:
    from frozentune.backbone import freeze

    out = {}
    for arch in a.archs.split(","):
        log(f"{arch}: pre-training on instructed copy / reverse")
        model, pre = pretrain(arch, 0, a.pretrain_steps, log)
        log(f"  {pre['exact_match']}")
        freeze(model)
        lm_dir = a.runs / f"{arch}-lm"
        model.save_pretrained(lm_dir)
        tokenizer().save_pretrained(lm_dir)
        data = write_pairs(a.runs / "reverse-data", 0, a.train_pairs)
        runs = {}
        for name, extra in (("direct", ["--no-reparam", "--lr", "1e-2"]), ("direct, lr 5e-2", ["--no-reparam", "--lr", "5e-2"]),
                            ("reparam", ["--reparam", "--lr", "1e-3"])):
            runs[name] = cli_run(lm_dir, data, a.runs / f"{arch}-{name.replace(', ', '-').replace(' ', '')}",
                                 ["--prefix-length", "10", "--epochs", str(a.epochs), "--batch-size", "16",
                                  "--patience", "5", *extra], log)
            log(f"  {arch} {name}: exact match {runs[name]['exact_match']:.1f}%")
        kinds = {}
        if arch == "bart":
            for kind in ("encoder", "decoder", "cross"):
                kinds[kind] = one_kind(lm_dir, data, kind, a.epochs, log)
                log(f"  {arch} {kind} only: exact match {kinds[kind]['exact_match']:.1f}%")
        out[arch] = {"pretrain": pre, "prefix": runs, "one_kind": kinds}
    return out


def mixed(a, log) -> dict:
    from frozentune.generation.prefix import PrefixConfig
    from frozentune.generation.seq2seq import Seq2SeqPrefixTuner, mixed as mix, seq2seq_generate, single

    lm = build("bart", 0).eval()
    k, new = a.requests, a.new_tokens
    rng = np.random.default_rng(0)
    src = [[WORDS.index(s) for s in x] + [EOS] for x in strings(k, rng, 8, 16)]
    tuner = Seq2SeqPrefixTuner(PrefixConfig(prefix_length=10, reparam=False), lm, None)
    torch.manual_seed(0)
    ps = [{kind: torch.randn(s.tensor_shape(10)) for kind, s in tuner.shapes.items()} for _ in range(k)]
    kw = dict(max_new_tokens=new, min_new_tokens=new)

    def run(batch, prompts):
        return seq2seq_generate(lm, tuner.sites, batch, prompts, PAD, EOS, **kw)

    modes = {"one prefix, one batch": lambda: run(single(ps[0], k), src),
             f"{k} prefixes, one batch": lambda: run(mix(ps), src),
             f"{k} prefixes one after another": lambda: [run(single(p, 1), [s])[0] for p, s in zip(ps, src)]}
    run(mix(ps[:2]), src[:2])  # warm-up
    times: dict[str, list[float]] = {m: [] for m in modes}
    outputs = {}
    for _ in range(a.repeats):
        for m, fn in modes.items():
            t0 = time.perf_counter()
            outputs[m] = fn()
            times[m].append(time.perf_counter() - t0)
    med = {m: statistics.median(v) for m, v in times.items()}
    tps = {m: k * new / med[m] for m in modes}
    names = list(modes)
    row = {"requests": k, "new_tokens": new, "repeats": a.repeats, "seconds": times, "tokens_per_s": tps,
           "mixed_vs_single": tps[names[1]] / tps[names[0]], "mixed_vs_sequential": tps[names[1]] / tps[names[2]],
           "mixed_rows_equal_sequential": outputs[names[1]] == outputs[names[2]]}
    log(", ".join(f"{m} {v:,.0f} tok/s" for m, v in tps.items())
        + f"; mixed/single {row['mixed_vs_single']:.2f}x, mixed/sequential {row['mixed_vs_sequential']:.2f}x, "
        f"rows equal {row['mixed_rows_equal_sequential']}")
    return row


# the published shapes (config.json of facebook/bart-base, facebook/bart-large, google-t5/t5-small, t5-base)
PUBLISHED = {
    "bart-base": ("bart", dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                               decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265,
                               max_position_embeddings=1024)),
    "bart-large": ("bart", dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                                decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
                                vocab_size=50265, max_position_embeddings=1024)),
    "t5-small": ("t5", dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128)),
    "t5-base": ("t5", dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, vocab_size=32128)),
}


def sizes(a, log) -> dict:
    """Saved prefix numbers (P·2·Σ N·K over the three kinds) and their share of the model, from the
    configs alone (models built on the meta device: no weights, no memory)."""
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    from frozentune.generation.seq2seq import shapes_from_config
    from frozentune.generation.seq2seq.tuner import saved_numel

    out = {}
    for name, (arch, dims) in PUBLISHED.items():
        cfg = (BartConfig if arch == "bart" else T5Config)(**dims)
        with torch.device("meta"):
            model = (BartForConditionalGeneration if arch == "bart" else T5ForConditionalGeneration)(cfg)
        total = sum(p.numel() for p in model.parameters())
        shapes = shapes_from_config(cfg)
        out[name] = {"params": total, "shapes": {k: [s.layers, s.heads, s.head_dim] for k, s in shapes.items()},
                     "saved": {p: saved_numel(p, shapes) for p in (10, 200)}}
        log(f"{name}: {total:,} parameters; prefix of 10 / 200 positions saves "
            + " / ".join(f"{n:,} ({100 * n / total:.2f}%)" for n in out[name]["saved"].values()))
    for arch in ("bart", "t5"):
        model = build(arch, 0)
        from frozentune.generation.prefix import PrefixConfig
        from frozentune.generation.seq2seq import Seq2SeqPrefixTuner
        tuner = Seq2SeqPrefixTuner(PrefixConfig(prefix_length=10), model, None)
        total = sum(p.numel() for p in model.parameters())
        saved = sum(v.numel() for v in tuner.trainable_state().values())
        out[f"tiny {arch} (this script's)"] = {"params": total, "saved": {10: saved},
                                               "shapes": {k: [x.layers, x.heads, x.head_dim] for k, x in tuner.shapes.items()},
                                               "trainable_reparam": tuner.num_trainable()}
        log(f"tiny {arch}: {total:,} parameters; prefix of 10 saves {saved:,} ({100 * saved / total:.1f}%)")
    return out


def report(r: dict) -> str:
    """REPORT.md's seq2seq-tiny block from results/seq2seq-tiny.json."""
    out = []
    if "sizes" in r:
        s = r["sizes"]
        out += [f"`{s['command']}` ({s['date']}): saved prefix numbers, P·2·Σ(N·K) over the three kinds, from each "
                "config's shapes (models built on the meta device)", "",
                "| model | parameters | prefix shapes (N × H × E per kind) | saved at P = 10 | saved at P = 200 |",
                "|---|---:|---|---:|---:|"]
        for name, v in s["result"].items():
            shapes = ", ".join(f"{k} {'×'.join(map(str, x))}" for k, x in v.get("shapes", {}).items())
            saved = v["saved"]
            cells = [f"{saved[p]:,} ({100 * saved[p] / v['params']:.2f}%)" if p in saved else "—" for p in ("10", "200")]
            out.append(f"| {name} | {v['params']:,} | {shapes} | {cells[0]} | {cells[1]} |")
        out.append("")
    if "task" in r:
        t = r["task"]
        out += [f"`{t['command']}` ({t['date']}, {t['machine']}): exact match on 500 held-out strings (499 distinct: the "
                f"CLI's runs score a repeated source once, since ed3ca17), greedy", "",
                "| model | instructed copy / reverse (whole model trained) | bare → reverse, no prefix | prefix, direct, lr 1e-2 "
                "| direct, lr 5e-2 | MLP, lr 1e-3 | MLP, encoder only | MLP, decoder only | MLP, cross only |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for arch, v in t["result"].items():
            em = v["pretrain"]["exact_match"]
            p, k = v["prefix"], v.get("one_kind") or {}
            kinds = [f"{k[x]['exact_match']:.1f}" if x in k else "—" for x in ("encoder", "decoder", "cross")]
            out.append(f"| tiny {arch} | {em['copy']:.1f} / {em['reverse']:.1f} | {em['bare → reverse (no prefix)']:.1f} "
                       f"| {p['direct']['exact_match']:.1f} ({p['direct']['train_seconds']:.0f} s) "
                       f"| {p['direct, lr 5e-2']['exact_match']:.1f} ({p['direct, lr 5e-2']['train_seconds']:.0f} s) "
                       f"| {p['reparam']['exact_match']:.1f} ({p['reparam']['train_seconds']:.0f} s) | "
                       + " | ".join(kinds) + " |")
        out.append("")
    if "mixed" in r:
        m, x = r["mixed"], r["mixed"]["result"]
        t = list(x["tokens_per_s"].values())
        out += [f"`{m['command']}` ({m['date']}, {m['machine']}; tiny BART, {x['requests']} requests × "
                f"{x['new_tokens']} new tokens, greedy, fixed length, median of {x['repeats']} interleaved repeats)", "",
                f"| one prefix, batch of {x['requests']} tok/s | {x['requests']} prefixes, one batch tok/s | one after "
                "another tok/s | mixed / one prefix | mixed / one after another | mixed rows = each alone |",
                "|---:|---:|---:|---:|---:|---|",
                f"| {t[0]:,.0f} | {t[1]:,.0f} | {t[2]:,.0f} | {x['mixed_vs_single']:.2f}x | {x['mixed_vs_sequential']:.2f}x "
                f"| {'yes' if x['mixed_rows_equal_sequential'] else 'NO'} |"]
    return "\n".join(out).rstrip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="sizes,task,mixed")
    ap.add_argument("--archs", default="bart,t5")
    ap.add_argument("--pretrain-steps", type=int, default=3000)
    ap.add_argument("--train-pairs", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "seq2seq-tiny.json",
                    help="results file (its parts are replaced by the ones run); the task's models go to --runs")
    ap.add_argument("--runs", type=Path, default=RUNS, help="folder for the task part's models")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    def log(s: str) -> None:
        print(s, flush=True)

    path = a.out
    from run import machine
    for part in a.part.split(","):
        result = {"task": task, "mixed": mixed, "sizes": sizes}[part](a, log)
        out = json.loads(path.read_text()) if path.is_file() else {}  # read now: another part may have run meanwhile
        out[part] = {"command": "python bench/seq2seq_tiny.py " + " ".join(sys.argv[1:]),
                     "date": time.strftime("%Y-%m-%d %H:%M"), "threads": torch.get_num_threads(),
                     "machine": machine(torch.get_num_threads()), "result": result}
        path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
