"""How faithful each head's own explanation is to the model's predictions.

ERASER's two measures (DeYoung et al., "ERASER: A Benchmark to Evaluate Rationalized NLP Models",
ACL 2020, §4), on whole words of the text:
- comprehensiveness: p(ŷ | x) − p(ŷ | x without the rationale). High when the words the explanation
  ranks first are the ones the prediction needs.
- sufficiency: p(ŷ | x) − p(ŷ | the rationale alone). Low when those words alone keep the prediction.
Both are averaged over rationales of the top 1, 5, 10, 20 and 50% of the words (ERASER's bins; at least one
word, at most half), which is their area over the perturbation curve (AOPC). ŷ is the model's prediction
on the whole text; the perturbed texts are read live by the same model (backbone and head).

Each model's own ranking (`frozentune explain`) is set beside two others of the same words:
- random: a seeded shuffle. An explanation that is no better than this says nothing about the model.
- occlusion: each word removed alone, ranked by how much p(ŷ) drops: a post-hoc explanation that costs one
  extra pass per word (what a user of a head without its own explanation would compute).
Word scores from an explanation: selfexplain, the sum of the weights α of the spans that cover the word;
ytuning, the predicted label's cross-attention on the word (its most attended piece); space, the predicted
class's attribution tanh(E·P) on the word. Ties keep the words' order.

  python bench/faithfulness.py bench/runs/selfexplain-sst5 bench/runs/ytuning-sst5 bench/runs/space-sst5 \
      --data sst5 --n 300 --threads 1
  python bench/faithfulness.py --report                  # the table from bench/results/faithfulness.json

Writes bench/results/faithfulness.json (one record per model and data set; a rerun replaces its own records).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "faithfulness.json"
BINS = (1, 5, 10, 20, 50)  # percent of the words, as ERASER's AOPC
RANKINGS = ("own", "random", "occlusion")
Text = str | tuple[str, str]  # a text, or a sentence pair
Words = list[tuple[int | None, int, int]]  # each word's part (None, or 0 / 1 of a pair) and [start, end) there
EMPTY_SIDE = "."  # what a pair's text becomes when no word of it is left (the API refuses an empty text)


def words_of(text: Text) -> Words:
    """Whitespace-separated words and their character ranges (in their part of a pair)."""
    parts = list(enumerate(text)) if isinstance(text, tuple) else [(None, text)]
    return [(k, m.start(), m.end()) for k, t in parts for m in re.finditer(r"\S+", t)]


def keep(text: Text, words: Words, kept: Sequence[int]) -> Text:
    """The text made of the words `kept` (indices, in the text's order), joined by single spaces; a pair
    keeps its two parts (EMPTY_SIDE for a part with no word kept)."""
    if not isinstance(text, tuple):
        return " ".join(text[words[i][1]:words[i][2]] for i in sorted(kept))
    sides = tuple(" ".join(text[k][a:b] for i in sorted(kept) for (k, a, b) in [words[i]] if k == part)
                  for part in (0, 1))
    return tuple(s or EMPTY_SIDE for s in sides)  # type: ignore[return-value]


def overlapping(items: list[dict], words: Words, combine: Callable[[float, float], float]) -> list[float]:
    """Per word: `combine` of the weights of the explanation's items ({start, end, weight, part}) that
    overlap it; −inf where none does (ranked last)."""
    scores = [-math.inf] * len(words)
    for it in items:
        if it.get("start") is None:  # a span of special tokens only: no characters
            continue
        for i, (k, a, b) in enumerate(words):
            if it.get("part") == k and it["start"] < b and a < it["end"]:
                w = float(it["weight"])
                scores[i] = w if scores[i] == -math.inf else combine(scores[i], w)
    return scores


def own_scores(row: dict, words: Words) -> list[float]:
    """Word scores from the head's own explanation of its prediction (row: one api.explain row)."""
    ex, label = row["explanation"], row["label"]
    if "spans" in ex:  # selfexplain: a word is as important as the spans that hold it, together
        return overlapping(ex["spans"], words, lambda a, b: a + b)
    if "attention" in ex:  # ytuning: the predicted label's attention
        return overlapping(ex["attention"][label], words, max)
    if "classes" in ex:  # space: the predicted class's attribution
        return overlapping(ex["classes"][label]["tokens"], words, max)
    raise SystemExit(f"an explanation of keys {sorted(ex)} is not one this script reads")


def order(scores: Sequence[float]) -> list[int]:
    """Word indices, highest score first; ties in the text's order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def bin_size(n_words: int, percent: int) -> int:
    """How many words the top `percent` holds: at least one, at most half (so neither side is empty)."""
    return min(max(1, round(n_words * percent / 100)), n_words // 2)


class Scorer:
    """p(label | text) from the model, for many texts at once, each text scored once."""

    def __init__(self, model) -> None:
        self.model, self.seen = model, {}

    def __call__(self, texts: Sequence[Text], labels: Sequence[str]) -> list[float]:
        from frozentune import api

        new = list(dict.fromkeys(t for t in texts if t not in self.seen))
        for t, r in zip(new, api.predict(self.model, new, log=lambda _line: None) if new else []):
            self.seen[t] = r["scores"]
        return [self.seen[t][lab] for t, lab in zip(texts, labels)]


def measure(model_dir: Path, texts: list[Text], seed: int, log: Callable[[str], None]) -> dict:
    """Comprehensiveness and sufficiency per ranking and bin, per text (lists), and the predictions."""
    from frozentune import api, model as M

    model = M.load(model_dir)
    model.eval()
    score = Scorer(model)
    t0 = time.perf_counter()
    rows = api.explain(model, texts, top=10_000, log=lambda _line: None)  # every span / word
    words = [words_of(t) for t in texts]
    pred = [r["label"] for r in rows]
    full = [r["scores"][r["label"]] for r in rows]
    # occlusion: one pass per word left out
    loo = [[keep(t, w, [j for j in range(len(w)) if j != i]) for i in range(len(w))] for t, w in zip(texts, words)]
    flat = [s for per in loo for s in per]
    p_loo = iter(score(flat, [p for per, p in zip(loo, pred) for _ in per]))
    ranks = {"own": [order(own_scores(r, w)) for r, w in zip(rows, words)],
             "random": [random.Random(f"{seed}:{i}").sample(range(len(w)), len(w)) for i, w in enumerate(words)],
             "occlusion": [order([f - next(p_loo) for _ in w]) for f, w in zip(full, words)]}
    log(f"  {model_dir.name}: explanations and occlusion in {time.perf_counter() - t0:.0f} s")
    out: dict = {"predicted": pred, "p_full": full}
    for name, per_text in ranks.items():
        comp, suff = [], []
        for t, w, r, p, f in zip(texts, words, per_text, pred, full):
            tops = [r[:bin_size(len(w), k)] for k in BINS]
            outside = [keep(t, w, sorted(set(range(len(w))) - set(top))) for top in tops]
            inside = [keep(t, w, top) for top in tops]
            comp.append([f - q for q in score(outside, [p] * len(BINS))])
            suff.append([f - q for q in score(inside, [p] * len(BINS))])
        out[name] = {"comprehensiveness": comp, "sufficiency": suff}
    log(f"  {model_dir.name}: {len(score.seen):,} distinct texts scored in {time.perf_counter() - t0:.0f} s")
    return out


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else 0.0)


def summary(rec: dict) -> dict:
    """AOPC (mean over bins, then over texts) ± standard error, per ranking and measure, and the paired
    difference own − random with its standard error."""
    s: dict = {}
    for measure_ in ("comprehensiveness", "sufficiency"):
        per = {r: [sum(b) / len(b) for b in rec[r][measure_]] for r in RANKINGS}
        s[measure_] = {r: mean_se(v) for r, v in per.items()}
        s[measure_]["own-random"] = mean_se([a - b for a, b in zip(per["own"], per["random"])])
        s[measure_]["own-occlusion"] = mean_se([a - b for a, b in zip(per["own"], per["occlusion"])])
    return s


def report(records: list[dict]) -> str:
    f = lambda ms: f"{ms[0]:.3f} ± {ms[1]:.3f}"  # noqa: E731
    lines = ["| data | model | method | n | accuracy | comprehensiveness own | random | occlusion | own − random "
             "| sufficiency own | random | occlusion | own − random |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rec in records:
        s = summary(rec)
        c, u = s["comprehensiveness"], s["sufficiency"]
        lines.append(f"| {rec['data']} {rec['split']} | {rec['model']} | {rec['method']} | {rec['n']} | {rec['accuracy']:.1f} "
                     f"| {f(c['own'])} | {f(c['random'])} | {f(c['occlusion'])} | {f(c['own-random'])} "
                     f"| {f(u['own'])} | {f(u['random'])} | {f(u['occlusion'])} | {f(u['own-random'])} |")
    cmds = sorted({r["command"] for r in records})
    return "\n".join(lines) + "\n\n" + "\n".join(f"`{c}` ({r})" for c, r in
                                                  ((c, ", ".join(sorted({x["environment"] for x in records if x["command"] == c})))
                                                   for c in cmds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--data", default="sst5")
    ap.add_argument("--split", default="test", choices=("test", "validation"))
    ap.add_argument("--n", type=int, default=300, help="texts of the split, a seeded sample (texts of 2 words or more)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    records = json.loads(a.out.read_text()) if a.out.exists() else []
    if a.report:
        print(report(records))
        return
    import torch

    from frozentune.data import load_classification
    from frozentune.output import run_environment

    torch.set_num_threads(a.threads)
    part = getattr(load_classification(a.data), a.split)
    able = [i for i, t in enumerate(part.texts) if len(words_of(t)) >= 2]
    picked = sorted(random.Random(a.seed).sample(able, min(a.n, len(able))))
    texts, gold = [part.texts[i] for i in picked], [part.labels[i] for i in picked]
    env = run_environment()
    where = f"{torch.get_num_threads()} torch thread(s), torch {env.get('torch')}, {time.strftime('%Y-%m-%d %H:%M')}"
    for d in a.models:
        cfg = json.loads((d / "config.json").read_text())
        rec = measure(d, texts, a.seed, lambda line: print(line, file=sys.stderr))
        acc = 100 * sum(p == g for p, g in zip(rec["predicted"], gold)) / len(gold)
        rec.update({"data": a.data, "split": a.split, "model": d.name, "method": cfg.get("method"), "n": len(texts), "seed": a.seed,
                    "accuracy": acc, "indices": picked, "environment": where,
                    "command": "python bench/faithfulness.py " + " ".join(sys.argv[1:])})
        records = [r for r in records if (r["data"], r.get("split"), r["model"]) != (a.data, a.split, d.name)] + [rec]
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(records))
        print(report([rec]))


if __name__ == "__main__":
    main()
