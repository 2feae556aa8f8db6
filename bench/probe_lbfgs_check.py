"""Experiment behind the SST-5 note in REPORT.md: the probe's convex problem solved exactly
(full-batch L-BFGS, L2 = 1/N as in scikit-learn's C=1, or 1e-3), compared on validation and test.

  python bench/probe_lbfgs_check.py
It reproduces logistic regression's test accuracy, and shows its validation accuracy on SST-5 is
below the AdamW probe's, which is why the probe keeps AdamW with early stopping.
"""
import torch, time
from frozentune import api, model as M
from frozentune.data import load_classification
from frozentune.train import eval_batches, evaluate
bb = api.BackboneOptions().load()
for data in ("sst5", "trec"):
    ds = load_classification(data)
    sf = api.SourceFactory(bb, False, None, False, False)
    src = {k: sf(getattr(ds, k)) for k in ("train", "validation", "test")}
    y = {k: ds.label_ids(getattr(ds, k)) for k in src}
    # pre-assemble the training batches once (they fit easily for a prototype)
    batches = [(src["train"].batch(idx), torch.from_numpy(y["train"][idx])) for idx in eval_batches(src["train"].lengths, 1024)]
    N = len(y["train"])
    for l2 in (1.0 / N, 1e-3):
        torch.manual_seed(0)
        m = M.build_classifier("probe", bb, ds.labels)
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.LBFGS(params, lr=1, max_iter=25, history_size=20, line_search_fn="strong_wolfe")
        def closure():
            opt.zero_grad()
            total = 0.0
            for b, yy in batches:
                loss = torch.nn.functional.cross_entropy(m(b).logits, yy, reduction="sum") / N
                loss.backward(); total += loss.item()
            reg = 0.5 * l2 * (m.head.out.weight ** 2).sum(); reg.backward()
            return total + reg.item()
        t = time.time()
        for ep in range(1, 9):
            opt.step(closure)
            if ep in (2, 4, 8):
                v, _ = evaluate(m, src["validation"], y["validation"]); te, _ = evaluate(m, src["test"], y["test"])
                print(data, f"l2 {l2:.2e} after {ep*25} iters: val {v['accuracy']:.2f} test {te['accuracy']:.2f}  {time.time()-t:.0f}s", flush=True)
