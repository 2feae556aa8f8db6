"""A head's inference path now against the same head's inference path at an earlier commit, side by
side in one process: the earlier `heads/<method>.py` is read from git (`git show REV:path`) and loaded
as a module of its own beside today's, both heads get the same weights, and each runs the same
batches without autograd, interleaved, torch pinned to --threads; best of --repeats. Their outputs
are compared too (largest logit difference), so a faster path that answers differently shows.

Batches as bench/span_packing.py's: 16 texts drawn with seed 0 from SST-2 test (short) or an IMDB
test slice (long, cut at 128 tokens), MiniLM's tokenizer, padded to the longest row rounded up to 8;
random states over D = 384 (speed does not depend on their values); each head with its defaults,
2 and 6 classes (Y-Tuning's label side grows with them). --methods picks the heads (ytuning,
selfexplain).

  OMP_NUM_THREADS=1 python bench/head_paths_ab.py --against fedcb57   # bench/results/head_paths_ab.json
  OMP_NUM_THREADS=1 python bench/head_paths_ab.py --against fedcb57 --methods selfexplain --out /tmp/se.json
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FILES = {"ytuning": "src/frozentune/heads/ytuning.py", "selfexplain": "src/frozentune/heads/self_explaining.py"}
CLASSES = {"ytuning": "YTuningHead", "selfexplain": "SelfExplainHead"}


def head_class_at(rev: str, method: str) -> type:
    """The head class of `method` as its file was at git revision `rev`, loaded as a module of its own
    (its relative imports made absolute, its registration left out: today's stays the registered one)."""
    text = subprocess.run(["git", "show", f"{rev}:{FILES[method]}"], cwd=HERE.parent, check=True,
                          capture_output=True, text=True).stdout
    text = text.replace("from ..head import", "from frozentune.head import")
    text = text.replace("from ..registry import MethodConfig, register_method", "from frozentune.registry import MethodConfig")
    text = text[:text.rindex("register_method(")]  # the registration is the file's last statement
    name = f"_{method}_at_{rev}"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, CLASSES[method])


def timed(head, feats: list) -> float:
    """Seconds for one pass over feats, without autograd."""
    import time

    from frozentune.head import Features
    with torch.no_grad():
        t = time.perf_counter()
        for hidden, mask in feats:
            head(Features(hidden, mask))
        return time.perf_counter() - t


def main() -> None:
    from span_packing import batches, parse_args, write_rows

    sys.argv, against = _pop(sys.argv, "--against", None)
    sys.argv, methods = _pop(sys.argv, "--methods", "ytuning")
    methods = methods.split(",")
    if unknown := set(methods) - set(FILES):
        raise SystemExit(f"head_paths_ab.py: --methods {','.join(sorted(unknown))} unknown; choose from {', '.join(FILES)}")
    a = parse_args(__doc__, "head_paths_ab.json")
    from frozentune.head import Features
    from frozentune.registry import create_method
    from serve_load import long_texts, short_texts

    rows = []
    for kind, texts in (("short (SST-2 test)", short_texts()), ("long (IMDB test)", long_texts())):
        masks = batches(texts, a.rows, a.count, 128)
        feats = [(torch.randn(*m.shape, 384) * m[..., None], m) for m in masks]
        for method, classes in ((m, c) for m in methods for c in (2, 6)):
            torch.manual_seed(0)
            now, cfg = create_method(method, 384, classes, {})
            then = head_class_at(against, method)(cfg, 384, classes)
            then.load_state_dict(now.state_dict())
            now.eval(), then.eval()
            with torch.no_grad():
                diff = max(float((now(Features(h, m)).logits - then(Features(h, m)).logits).abs().max()) for h, m in feats)
            best = {"then": float("inf"), "now": float("inf")}
            for _ in range(a.repeats):
                for which, head in (("then", then), ("now", now)):
                    best[which] = min(best[which], timed(head, feats))
            row = {"texts": kind, "method": method, "classes": classes, "batches": a.count, "rows": a.rows,
                   "mean_padded_tokens": sum(m.shape[1] for m in masks) / len(masks), "against": against,
                   "then_ms": 1000 * best["then"] / a.count, "now_ms": 1000 * best["now"] / a.count,
                   "speedup": best["then"] / best["now"], "max_logit_difference": diff}
            rows.append(row)
            print(f"{kind:20s} {method:11s} {classes} classes: at {against} {row['then_ms']:.2f} ms, now "
                  f"{row['now_ms']:.2f} ms, {row['speedup']:.2f}×; logits differ by at most {diff:.2g}", flush=True)
    write_rows(a, f"head_paths_ab.py --against {against} --methods {','.join(methods)}", rows)


def _pop(argv: list[str], flag: str, default: str | None) -> tuple[list[str], str]:
    """An option of this script's own taken out of argv before span_packing's parser reads the rest;
    a missing one without a default is an error saying what to give."""
    if flag not in argv:
        if default is None:
            raise SystemExit(f"head_paths_ab.py: give {flag} REV, the commit whose inference paths to compare with")
        return argv, default
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"head_paths_ab.py: {flag} needs a value")
    return argv[:i] + argv[i + 2:], argv[i + 1]


if __name__ == "__main__":
    main()
