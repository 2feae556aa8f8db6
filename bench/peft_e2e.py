"""PEFT's prefix-tuning beside frozentune's prefix on E2E with SmolLM2-135M (issue 18).

    OMP_NUM_THREADS=1 python bench/peft_e2e.py --side frozentune --pairs 100 --epochs 8
    OMP_NUM_THREADS=1 python bench/peft_e2e.py --side peft --pairs 100 --epochs 8
    OMP_NUM_THREADS=1 python bench/peft_e2e.py --side peft-guide --pairs 100 --epochs 8
    python bench/peft_e2e.py --report          # the markdown table from bench/results/peft_e2e.jsonl

Every side sees the same data and runs through the same code except the prefix itself:
- the same (mr, reference) pairs, drawn as `frozentune train --data e2e --max-train N
  --max-validation 100 --seed S` draws them (E2E here has dev and test only: training pairs come
  from dev, 10% of dev's sources held out for the validation loss);
- the same training loop (frozentune's `fit_loop`: AdamW, 6% warm-up then linear decay, gradient
  clipping, seeded batches of 8, the validation loss after each epoch, early stopping with
  patience 2, the best epoch's weights kept), the same epoch budget (the paper's: 8 epochs at 100
  pairs, 3 at 500; `--min-steps 0`, so frozentune's step floor adds none);
- the same loss: mean cross-entropy over the target tokens of `source <bos> ' ' target <eos>`;
- the same decoding and scoring: PEFT's trained adapter is saved with `save_pretrained`, imported
  with `frozentune export --format peft`'s inverse (`import_peft`), and decoded greedily by
  frozentune's decoder over all 630 E2E test MRs, then scored with sacrebleu (BLEU, chrF) and
  rouge-score. (PEFT 0.21.2's own `generate` drops the prefix under transformers 5.24,
  `export.peft.peft_generate_drops_prefix`, so its decoder cannot be used for this.)

Sides:
- `frozentune`: `--method prefix --init words`, L_p 10, the MLP reparameterisation (576 → 512 →
  11,520), started from the LM's keys/values on "table-to-text:" (Li & Liang §7.4), lr 3e-4.
- `frozentune-random`: the same with `--init random` (P' drawn at random, as PEFT starts), to
  tell the start from the rest.
- `peft`: PEFT's `PrefixTuningConfig(num_virtual_tokens=10, prefix_projection=True,
  encoder_hidden_size=512)`: the same shape and the same MLP, PEFT's random start (it has no
  start from words for prefix-tuning), lr 3e-4.
- `peft-guide`: PEFT as its prompt-based-methods guide sets it up for a causal LM:
  `PrefixTuningConfig(num_virtual_tokens=10)` with its default `prefix_projection=False` (the
  prefix trained directly), lr 3e-2 (the guide's).

Times are wall seconds on this machine with one torch thread; runs that shared the two cores are
marked in each row (`beside`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "peft_e2e.jsonl"
LM = "smollm2-135m"
SIDES = ("frozentune", "frozentune-random", "peft", "peft-guide")
PEFT_LR = {"peft": 3e-4, "peft-guide": 3e-2}
GREEDY = {"num_beams": 1}  # every side decodes greedily, with frozentune's other decoding defaults (DecodeOptions)
LABEL = {"frozentune": "frozentune, --init words", "frozentune-random": "frozentune, --init random (its default)",
         "peft": "PEFT, same shape", "peft-guide": "PEFT as its guide"}


class PeftTuner(nn.Module):
    """A PEFT prefix-tuning model as frozentune's trainer drives a generation tuner: `loss` over
    the target tokens, `encode_sources` / `encode_targets` in frozentune's format. Its trainable
    parameters are PEFT's prompt encoder's only."""

    def __init__(self, peft_model: nn.Module, lm: nn.Module, tok):
        super().__init__()
        self.peft, self.tok = peft_model, tok
        from frozentune.generation.prefix import pad_id_of
        self.pad = pad_id_of(lm, tok)

    def encode_sources(self, texts):
        from frozentune.generation.prefix import encode_sources
        return encode_sources(self.tok, texts)

    def encode_targets(self, texts):
        from frozentune.generation.prefix import encode_targets
        return encode_targets(self.tok, texts)

    def loss(self, sources, targets) -> torch.Tensor:
        from frozentune.generation.prefix import pack_pairs
        ids, mask, labels = pack_pairs(sources, targets, self.pad)
        return self.peft(input_ids=ids, attention_mask=mask, labels=labels).loss


def peft_config(side: str):
    from peft import PrefixTuningConfig, TaskType

    if side == "peft":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=10, prefix_projection=True,
                                  encoder_hidden_size=512)
    return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=10)


def run_peft(side: str, pairs: int, epochs: int, seed: int, max_test: int | None, log) -> dict:
    """Train PEFT's prefix with frozentune's loop, import it, decode and score as frozentune does."""
    import dataclasses

    from peft import __version__ as peft_version, get_peft_model

    from frozentune.api import peak_rss_mb, train_config
    from frozentune.backbone import load_generation_lm
    from frozentune.export.peft import import_peft
    from frozentune.generation.run import (DecodeOptions, decode, encode_pairs, fit_generation, grouped_scores,
                                      load_generation_splits, load_tuner, mean_loss)
    from frozentune.registry import get_method

    cfg = train_config(get_method("prefix").generation_defaults,
                       {"epochs": epochs, "seed": seed, "lr": PEFT_LR[side], "min_steps": 0})
    splits = load_generation_splits("e2e", seed, pairs, 100, max_test)
    lm, tok = load_generation_lm(LM)
    lm_params = sum(p.numel() for p in lm.parameters())
    torch.manual_seed(seed)
    model = get_peft_model(lm, peft_config(side))
    tuner = PeftTuner(model, lm, tok)
    trainable = sum(p.numel() for p in tuner.parameters() if p.requires_grad)
    log(f"{side}: PEFT {peft_version}, {trainable:,} trainable parameters, lr {cfg.lr:g}, "
        f"{len(splits.train)} train / {len(splits.validation)} validation pairs")
    fitted = fit_generation(tuner, tok, splits, cfg, log)
    with tempfile.TemporaryDirectory() as tmp:
        adapter, folder = Path(tmp) / "adapter", Path(tmp) / "imported"
        model.save_pretrained(str(adapter), safe_serialization=True)
        import_peft(adapter, folder, backbone=LM, log=log)
        saved = json.loads((adapter / "adapter_config.json").read_text())
        ft, ftok, _ = load_tuner(folder)
        # the imported prefix must be the model PEFT trained: its validation loss through frozentune's forward
        imported_loss = mean_loss(ft, *encode_pairs(ft, splits.validation), cfg.eval_batch_size)
        saved_params = sum(v.numel() for v in ft.trainable_state().values())
        t0 = time.perf_counter()
        d = DecodeOptions(**GREEDY)
        hyps = decode(ft, ftok, [ex.source for ex in splits.test], d.num_beams, d.max_new_tokens, d.batch_size)
        decode_seconds = time.perf_counter() - t0
    metrics = grouped_scores(hyps, splits.test)["all"]
    best = min(h["val_loss"] for h in fitted.history)
    log(f"validation loss: {best:.5f} in PEFT's forward, {imported_loss:.5f} imported into frozentune")
    return {"metrics": metrics, "validation_loss": best, "imported_validation_loss": imported_loss,
            "best_epoch": fitted.best_epoch, "train_seconds": fitted.train_seconds,
            "decode_seconds": decode_seconds, "trainable_params": trainable, "saved_params": saved_params,
            "backbone_params": lm_params, "peak_rss_mb": peak_rss_mb(), "history": fitted.history,
            "train": dataclasses.asdict(cfg), "peft_version": peft_version,
            "peft_config": {k: saved.get(k) for k in ("num_virtual_tokens", "prefix_projection", "encoder_hidden_size",
                                                      "num_layers", "num_attention_heads", "token_dim")},
            "outputs_head": hyps[:3]}


def run_frozentune(init: str, pairs: int, epochs: int, seed: int, max_test: int | None, log) -> dict:
    from frozentune.generation.run import DecodeOptions, train_generation

    r = train_generation("prefix", "e2e", LM, options={"init": init},
                         train_cfg={"epochs": epochs, "seed": seed, "min_steps": 0}, max_train=pairs,
                         max_validation=100, max_test=max_test, decoding=DecodeOptions(**GREEDY), log=log)
    return {"metrics": r["metrics"], "validation_loss": r["validation"]["loss"], "best_epoch": r["best_epoch"],
            "train_seconds": r["train_seconds"], "decode_seconds": r["decode_seconds"],
            "trainable_params": r["trainable_params"], "saved_params": r["saved_params"],
            "backbone_params": r["backbone_params"], "peak_rss_mb": r["peak_rss_mb"], "history": r["history"],
            "train": r["config"]["train"]}


def machine() -> dict:
    from serve_load import cpu_model  # bench/ is on the path: the script's own folder

    from frozentune.extract import cpu_features

    return {"cpu": cpu_model(), "features": cpu_features(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: (r["pairs"], SIDES.index(r["side"]), r["seed"]))
    out = ["| pairs | side | seed | lr | BLEU | chrF | ROUGE-L | val loss | best epoch | trained params | saved params | "
           "train s | decode s | beside |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r["metrics"]
        out.append(f"| {r['pairs']} | {LABEL[r['side']]} | {r['seed']} | {r['train']['lr']:g} | {m['bleu']:.2f} | {m['chrf']:.2f} | "
                   f"{m['rouge_l']:.2f} | {r['validation_loss']:.3f} | {r['best_epoch']} | {r['trainable_params']:,} | "
                   f"{r['saved_params']:,} | {r['train_seconds']:.0f} | {r['decode_seconds']:.0f} | {r.get('beside') or '-'} |")
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["pairs"], r["side"]), []).append(r)
    out += ["", "| pairs | side | seeds | BLEU mean (per seed) | chrF mean | ROUGE-L mean | train s mean |",
            "|---:|---|---:|---|---:|---:|---:|"]
    for (pairs, side), rs in groups.items():
        mean = lambda f: sum(f(r) for r in rs) / len(rs)  # noqa: E731
        per = " / ".join(f"{r['metrics']['bleu']:.2f}" for r in rs)
        out.append(f"| {pairs} | {LABEL[side]} | {len(rs)} | {mean(lambda r: r['metrics']['bleu']):.2f} ({per}) | "
                   f"{mean(lambda r: r['metrics']['chrf']):.2f} | {mean(lambda r: r['metrics']['rouge_l']):.2f} | "
                   f"{mean(lambda r: r['train_seconds']):.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=SIDES)
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-test", type=int, default=None, help="a seeded sample of test MRs (a smoke run); default all 630")
    ap.add_argument("--beside", default="", help="what else ran on the machine meanwhile (recorded in the row)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    if a.report:
        print(report(a.out))
        return
    if a.side is None:
        sys.exit(f"give --side ({', '.join(SIDES)}) or --report")
    torch.set_num_threads(a.threads)
    log = lambda line: print(line, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    res = (run_frozentune("random" if a.side.endswith("random") else "words", a.pairs, a.epochs, a.seed, a.max_test, log)
           if a.side.startswith("frozentune")
           else run_peft(a.side, a.pairs, a.epochs, a.seed, a.max_test, log))
    row = {"side": a.side, "pairs": a.pairs, "epochs": a.epochs, "seed": a.seed, "max_test": a.max_test, "beside": a.beside,
           "wall_seconds": time.perf_counter() - t0, "command": " ".join(["python", *sys.argv]),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "machine": machine(), **res}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    m = res["metrics"]
    log(f"{a.side} {a.pairs} pairs: BLEU {m['bleu']:.2f} chrF {m['chrf']:.2f} ROUGE-L {m['rouge_l']:.2f} "
        f"val loss {res['validation_loss']:.3f} train {res['train_seconds']:.0f}s decode {res['decode_seconds']:.0f}s")


if __name__ == "__main__":
    main()
