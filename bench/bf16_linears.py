"""bf16 autocast with the linear weights cast once vs autocast recasting them every call (MiniLM,
1 thread, the first 3,000 SST-2 train sentences, length-sorted batches, 3 interleaved rounds).

  OMP_NUM_THREADS=1 python bench/bf16_linears.py

The second form is what extract/precision.py's prepare('bf16') builds; the first is plain
autocast over a frozen fp32 copy. Prints the median time, the ratio to fp32 and the largest
difference of the last layer's states between the two forms (0 means the same products).
"""
import time
import warnings

import numpy as np
import torch

from frozentune.backbone import Backbone, iter_states
from frozentune.data import load_classification
from frozentune.extract.precision import AutocastModel, _frozen_copy, prepare

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
bb = Backbone.load("minilm", max_length=128)
tokens = bb.tokenize(load_classification("sst2").train.texts[:3000])
cpu = torch.device("cpu")
plain = AutocastModel(_frozen_copy(bb.model, cpu), "cpu", torch.bfloat16).eval()
cast_once = prepare(bb.model, "bf16", cpu)


def run(model) -> float:
    t = time.perf_counter()
    for _ in iter_states(model, bb.tok, tokens, bb.layers):
        pass
    return time.perf_counter() - t


forms = {"fp32": bb.model, "autocast": plain, "autocast, linears cast once": cast_once}
for m in forms.values():
    run(m)
times = {k: [] for k in forms}
for _ in range(3):
    for k, m in forms.items():
        times[k].append(run(m))
for k, v in times.items():
    print(f"{k:30s} {np.median(v):6.2f}s  x{np.median(times['fp32']) / np.median(v):.2f} fp32")
ids = torch.from_numpy(tokens.ids[0])[None]
with torch.no_grad():
    a = plain(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.float()
    b = cast_once(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.float()
print("largest state difference between the two forms:", (a - b).abs().max().item())
