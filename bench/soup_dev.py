"""Few labels, a design check on development rows, never test (issue 21): where cross-validation keeps a
head, is the mean of the refit's and the k fold models' weights at the chosen step (a uniform model soup)
better than the refit alone? Also the fold models' mean alone ("foldsoup") and the average of the k + 1
models' probabilities ("ensemble", which would need k + 1 heads at prediction).

  OMP_NUM_THREADS=1 python bench/soup_dev.py OUT.json sst2,sst5,trec 8,16,32 0,1,2,3,4 ytuning
  python bench/soup_dev.py --report OUT.json

The development rows hold neither the K-shot sample nor test: SST-5's validation file; for SST-2 and TREC the
10% validation carve of the whole train file (seeded as the run), less the sample's texts. Each run is
`api.train` with --average-folds off (the refit alone: "base"); the fold models' weights are kept at every
checkpoint by wrapping crossval.fit, and the variants are scored on the same rows. Runs where the folds
kept the logistic regression have no head to average: every variant is the regression there.
bench/results/soup_dev.json was written before --average-folds existed (the refit alone was the model),
at commit b4567a9, by this script less the average_folds option it now passes."""
import dataclasses, json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from frozentune import api
import frozentune.api as A
import frozentune.crossval as CV
import frozentune.train as T
from frozentune.data import load_classification

def report(path: Path) -> str:
    """The table of a results file: per method, dataset and K, the mean development accuracy of each variant
    over all runs, and over the runs where the folds kept the head (the others are the regression in every
    variant), with the runs won and lost by the soup against the refit alone."""
    import statistics as st

    rows = json.loads(path.read_text())["rows"]
    out = ["| method | data | K | runs | head kept | base | soup | fold soup | ensemble | kept: base → soup | soup won / lost |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    cells = dict.fromkeys((r["method"], r["data"], r["shots"]) for r in rows)
    for m, d, k in cells:
        rs = [r for r in rows if (r["method"], r["data"], r["shots"]) == (m, d, k)]
        kept = [r for r in rs if not r["fallback"]]
        mean = lambda key, of=rs: f"{st.mean(r[key] for r in of):.1f}" if of else ""  # noqa: E731
        won = sum(r["soup"] > r["base"] for r in kept)
        lost = sum(r["soup"] < r["base"] for r in kept)
        out.append(f"| {m} | {d} | {k} | {len(rs)} | {len(kept)} | {mean('base')} | {mean('soup')} | {mean('foldsoup')} | "
                   f"{mean('ensemble')} | {mean('base', kept)} → {mean('soup', kept)} | {won} / {lost} |")
    for m in dict.fromkeys(r["method"] for r in rows):
        kept = [r for r in rows if r["method"] == m and not r["fallback"]]
        if kept:
            gain = [r["soup"] - r["base"] for r in kept]
            out.append(f"\n{m}: the head was kept in {len(kept)} of {sum(r['method'] == m for r in rows)} runs; there the "
                       f"soup gained {st.mean(gain):+.2f} points on average (from {min(gain):+.1f} to {max(gain):+.1f}), "
                       f"won {sum(g > 0 for g in gain)}, lost {sum(g < 0 for g in gain)}")
    return "\n".join(out)


if sys.argv[1] == "--report":  # python bench/soup_dev.py --report bench/results/soup_dev.json
    print(report(Path(sys.argv[2])))
    sys.exit(0)
OUT = Path(sys.argv[1])
DATA = sys.argv[2].split(",")
SHOTS = [int(s) for s in sys.argv[3].split(",")]
SEEDS = [int(s) for s in sys.argv[4].split(",")]
METHODS = sys.argv[5].split(",")
LAYER = {"space": "-3"}

snaps: list[dict] = []
orig_fit, orig_fit_cv = CV.fit, A.fit_cv
state = {}

def fit_wrap(model, tr, ytr, val, yval, cfg, log=print, schedule=None, select=True, on_round=None, **kw):
    if schedule is not None and schedule.at:  # a fold run: keep its weights at every checkpoint (after its scoring)
        cur = []
        snaps.append(cur)

        def snap():
            cur.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            if on_round is not None:
                on_round()
        return orig_fit(model, tr, ytr, val, yval, cfg, log, schedule, select, on_round=snap, **kw)
    return orig_fit(model, tr, ytr, val, yval, cfg, log, schedule, select, on_round=on_round, **kw)

def average(states):
    out = {}
    for k, v in states[0].items():
        out[k] = torch.stack([s[k].float() for s in states]).mean(0).to(v.dtype) if v.is_floating_point() else v
    return out

def fit_cv_wrap(build, *args, **kw):
    snaps.clear()
    model, fitted, info = orig_fit_cv(build, *args, **kw)
    state.clear()
    if info.get("fallback") or "checkpoints" not in info:
        state["variants"] = None
        return model, fitted, info
    j = info["checkpoints"].index(info["chosen_steps"])
    folds = [s[j] for s in snaps]
    refit = {k: v.detach().clone() for k, v in model.state_dict().items()}
    variants = {}
    for name, sts in (("soup", [refit] + folds), ("foldsoup", folds)):
        m = build(); m.load_state_dict(average(sts)); m.eval(); variants[name] = m
    ens = []
    for s in folds:
        m = build(); m.load_state_dict(s); m.eval(); ens.append(m)
    variants["ensemble"] = [model] + ens
    state["variants"] = variants
    return model, fitted, info

CV.fit, A.fit_cv = fit_wrap, fit_cv_wrap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from few_shot import dev_rows as dev_split  # noqa: E402  (SST-5's validation file; SST-2's and TREC's carve)

done = json.loads(OUT.read_text()) if OUT.exists() else {"rows": []}
have = {(r["data"], r["shots"], r["seed"], r["method"]) for r in done["rows"]}
bbs = {}
def bb(layer):
    if layer not in bbs:
        bbs[layer] = api.BackboneOptions(layers=layer).load()
    return bbs[layer]

for data in DATA:
    for k in SHOTS:
        for seed in SEEDS:
            ds = load_classification(data, seed=seed, shots=k, carve_below=1000)
            dev = dev_split(data, ds, seed)
            dsd = dataclasses.replace(ds, test=dev)
            for method in METHODS:
                if (data, k, seed, method) in have:
                    continue
                t0 = time.perf_counter()
                b = bb(LAYER.get(method, "-1"))
                r = api.train(method, dsd, b, train_cfg={"seed": seed, "average_folds": "off"}, progress=False, log=lambda s: None)
                row = {"data": data, "shots": k, "seed": seed, "method": method, "n_dev": len(dev),
                       "base": r["metrics"]["accuracy"], "fallback": bool(r["selection"].get("fallback")),
                       "chosen": r["selection"].get("chosen_steps"), "seconds": time.perf_counter() - t0}
                v = state.get("variants")
                if v:
                    src = api.SourceFactory(b, False, None, False, False)(dev)
                    y = dsd.label_ids(dev)
                    for name in ("soup", "foldsoup"):
                        row[name] = T.scored(v[name], src, y)["accuracy"]
                    probs = sum(torch.softmax(torch.from_numpy(T.predict_logits(m, src, 256)), 1) for m in v["ensemble"])
                    row["ensemble"] = 100.0 * float((probs.argmax(1).numpy() == y).mean())
                else:
                    row["soup"] = row["foldsoup"] = row["ensemble"] = row["base"]
                done["rows"].append(row)
                OUT.write_text(json.dumps(done, indent=1))
                print(json.dumps(row), flush=True)
