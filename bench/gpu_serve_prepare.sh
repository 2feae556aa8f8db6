#!/usr/bin/env bash
# Make what PARTS="serve extract-tmpfs" bash bench/gpu_run.sh carries to a GPU machine (device tool; at
# most 64 MiB travel, the working tree included), all of it git-ignored under .gpu/:
#   .gpu/minilm-xz/     MiniLM's weights rounded to fp16, byte planes xz-compressed (39 MB; gpu_prepare.py --planes),
#                       its tokenizer files
#   .gpu/serve/data/    SST-2 test, and the 1,000 IMDB test reviews bench/serve_load.py samples (seed 0)
#   .gpu/serve/models/heads/  bench/serve_load.py's 8 SST-2 heads, trained here on that fp16-rounded
#                       MiniLM (a model refuses a backbone whose weights differ from its own)
#   .gpu/serve/wheels/  fastapi, uvicorn, prometheus-client, psutil, httpx and their dependencies
#                       httptools, uvloop (binary wheels for $PYTHONS, default 3.12; bench/gpu_deps.py unpacks them there)
#   .gpu/serve/lib/     this machine's libtcmalloc_minimal.so.4 (168 KB; needs glibc 2.29), which gpu_run.sh
#                       preloads under the servers where the GPU machine has none (apt-get install libtcmalloc-minimal4)
# Needs .gpu/minilm-fp16 (bench/gpu_prepare.py's docstring) and ../shared/data. About 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${FROZENTUNE_DATA:-$PWD/../shared/data}
mkdir -p .gpu/minilm-xz .gpu/serve/data/sst2 .gpu/serve/data/imdb .gpu/serve/models .gpu/serve/wheels .gpu/serve/lib
cp -L /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .gpu/serve/lib/
for f in .gpu/minilm-fp16/*; do
  case $f in */model.safetensors) $PY bench/gpu_prepare.py --planes "$f" .gpu/minilm-xz/model.safetensors.planes.xz ;; *) cp "$f" .gpu/minilm-xz/ ;; esac
done
cp "$DATA/sst2/test.jsonl" .gpu/serve/data/sst2/
FROZENTUNE_DATA=$DATA $PY - <<'EOF'
import json, sys
sys.path.insert(0, "bench")
import serve_load
from frozentune.data import data_root
by = {}  # each sampled text's record as the file has it
for line in (data_root() / "imdb" / "test.jsonl").read_text().split("\n"):
    if line.strip():
        rec = json.loads(line)
        by.setdefault(rec["text"], rec)
sample = serve_load.long_texts()  # the benchmark's own sample, in its order
open(".gpu/serve/data/imdb/test.jsonl", "w").write("\n".join(json.dumps(by[t]) for t in sample) + "\n")
EOF
for v in ${PYTHONS:-3.12}; do  # the GPU machine's python3 (3.12.3 on 2026-11-26)
  $PY -m pip download -q fastapi uvicorn prometheus-client psutil httpx httptools uvloop --only-binary=:all: --implementation cp \
    --python-version $v --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .gpu/serve/wheels
done
# the heads, on the fp16-rounded MiniLM: its alias module on PYTHONPATH, as on the GPU machine
$PY bench/gpu_prepare.py .gpu/minilm-xz /tmp/minilm-rounded /tmp/site-rounded
PYTHONPATH=/tmp/site-rounded FROZENTUNE_DATA=$DATA OMP_NUM_THREADS=1 $PY -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
import serve_load
print(serve_load.train_heads(Path('.gpu/serve/models/heads')))"
du -sh .gpu/minilm-xz .gpu/serve
