"""How far apart MiniLM's states are under edited config.json files and under other precisions, and what
the format-3 → 4 upgrade does with an old entry made from an edited config (cache.agreeing).

Format 3's cache key held the weights, tokenizer and texts but not the config, so a folder of MiniLM's
weights with 6 heads shared its entry with the stock model. cache.PASS_AGREEMENT is the difference two
passes of one model may show in a precision; this script measures, on the 4 shortest of 200 SST-2 test
sentences (what cache.disagreement compares), the mean per-token relative L2 difference of
  * a reduced-precision pass against fp32 (the noise the tolerance must admit), and
  * an edited config against the stock one (what it must not admit, or may: states within the noise),
then makes format-3 entries of the 6-head model in fp32, bf16 and int8 and asks the stock model for them.

    OMP_NUM_THREADS=1 python bench/old_entry_configs.py   → bench/results/old_entry_configs.json
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from frozentune.backbone import Backbone, _minilm_path, iter_states
from frozentune.cache import PASS_AGREEMENT, get_or_build, legacy_keys, meta_sha
from frozentune.data import data_root

EDITS = [("num_attention_heads", 6), ("num_attention_heads", 24), ("hidden_act", "gelu_new"),
         ("hidden_act", "relu"), ("layer_norm_eps", 1e-5), ("layer_norm_eps", 1e-6)]


def states(bb: Backbone, texts: list[str]) -> list[torch.Tensor]:
    toks, out = bb.tokenize(texts), {}
    for idx, s, m in iter_states(bb.runner, bb.tok, toks, bb.layers):
        for j, i in enumerate(idx):
            out[int(i)] = s[j][m[j]].float()
    return [out[i] for i in range(len(texts))]


def apart(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(np.mean([((x - y).norm(dim=-1) / y.norm(dim=-1)).mean() for x, y in zip(a, b)]))


def edited(src: Path, folder: Path, field: str, value) -> Path:
    shutil.copytree(src, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, **{field: value})))
    return folder


def as_format3(root: Path, meta: dict, old: str) -> None:
    """The entry as format 3 wrote it: under its old key, no config in meta.json."""
    os.rename(root / meta["key"], root / old)
    meta = {k: v for k, v in meta.items() if k != "config"}
    meta.update(format=3, key=old)
    meta["meta_sha"] = meta_sha(meta)
    (root / old / "meta.json").write_text(json.dumps(meta))


def main() -> None:
    torch.set_num_threads(1)
    src = Path(_minilm_path())
    lines = (data_root() / "sst2" / "test.jsonl").read_text().splitlines()[:200]
    texts = [json.loads(line)["text"] for line in lines]
    lengths = Backbone.load(str(src)).tokenize(texts).lengths
    shortest = [texts[i] for i in np.argsort(lengths, kind="stable")[:4]]  # as cache.disagreement picks them
    work = Path(tempfile.mkdtemp(prefix="old-entry-"))
    out: dict = {"command": "OMP_NUM_THREADS=1 python bench/old_entry_configs.py", "texts": shortest,
                 "threads": torch.get_num_threads(), "tolerance (PASS_AGREEMENT, before the stored dtype's eps/2)":
                 PASS_AGREEMENT, "precision vs fp32": {}, "edited config vs stock (fp32)": {}, "upgrade": {}}
    ref = states(Backbone.load(str(src)), shortest)
    for p in ("bf16", "int8"):
        out["precision vs fp32"][p] = apart(states(Backbone.load(str(src), precision=p), shortest), ref)
    for field, value in EDITS:
        folder = edited(src, work / f"{field}-{value}", field, value)
        out["edited config vs stock (fp32)"][f"{field}={value}"] = apart(states(Backbone.load(str(folder)), shortest), ref)
    six = edited(src, work / "six", "num_attention_heads", 6)
    for p in ("fp32", "bf16", "int8"):
        stock, other, root = Backbone.load(str(src), precision=p), Backbone.load(str(six), precision=p), work / p
        made, _ = get_or_build(other, texts, root, progress=False)
        as_format3(root, made.meta, legacy_keys(other, texts)[0])
        said: list[str] = []
        _, secs_stock = get_or_build(stock, texts, root, progress=False, log=said.append)
        _, secs_six = get_or_build(other, texts, root, progress=False, log=said.append)
        out["upgrade"][p] = {"stock model": "built anew" if secs_stock > 0 else "REUSED the 6-head states",
                             "6-head model": "re-keyed" if secs_six == 0 else "rebuilt", "said": said}
    shutil.rmtree(work)
    dest = Path(__file__).parent / "results" / "old_entry_configs.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
