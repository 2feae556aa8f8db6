#!/usr/bin/env bash
# Issue 16's GPU figures in one call of the device tool (a bare machine with torch + transformers):
#   .gpu/ (git-ignored, carried): minilm-fp16/ (MiniLM as fp16, 45 MB), data/sst2/ (the SST-2 files)
#   device run: bash bench/gpu_run.sh     (carry .gpu; writes $OUT/*.json and $OUT/log.txt)
# 1. bench/gpu_extract.py: tokens/s of a bare forward loop vs a full cache build, fp32/bf16/fp16,
#    MiniLM's shape and BERT-base's; 2. the SST-2 suite of heads trained on the GPU (default
#    precision, then fp32 for the probe and Y-Tuning); 3. each of
#    those heads evaluated on states made by the CPU (fp32) and by the GPU (fp32/bf16/fp16).
# Issue 17's GPU figures: MINILM=.gpu/minilm-xz PARTS="serve extract-tmpfs" bash bench/gpu_run.sh, carrying
# .gpu/minilm-xz and
# .gpu/serve (made by bench/gpu_serve_prepare.sh: the 8 SST-2 heads of bench/serve_load.py, the SST-2
# test set and its 1,000-review IMDB sample, the serving stack's wheels):
#   serve          bench/serve_load.py --only batching,heads with every server on the GPU (the 1/4/8-head
#                  table, 8 one-head servers, batching on/off and the plain Hugging Face loop's ceiling)
#   extract-tmpfs  1. again, the cache folder on /dev/shm: the cache build against the bare loop without the disk
#   graphs         bench/gpu_graphs_check.py: the 8 heads as CUDA graphs against the same engine without (answers,
#                  which heads were recorded, the batch's time); the serve part runs only if this one succeeds
#   extract-ab     gpu_extract.py on /dev/shm, this tree's src/ and $OLD_SRC's in turn, AB_ROUNDS times
#   (EXTRACT_ARGS: more options of gpu_extract.py in extract-tmpfs, e.g. --profile)
#   serve-ab       bench/serve_heads_ab.py: the 1- and 8-head servers of this tree and of $OLD_SRC (a carried older src/,
#                  OLD_NAME to name it) in interleaved repeats on the GPU, each version with its own 8/1 ratio
#   rss            bench/gpu_rss_probe.py: a 1-head and an 8-head engine's host memory, CUDA's lazy module loading or not
#   gil            bench/gpu_batch_gil.py: the 1- and 8-head engines' batches beside a busy thread, per switch interval
#                  and per way of reading the scores
# The serve part preloads .gpu/serve/lib/libtcmalloc_minimal.so.4 where it was carried (the servers' --allocator
# auto then runs on it, as where it is installed) and runs the twins with $SERVE_TWIN (default on a GPU:
# --cuda-graphs off), and $SERVE_ARGS as more options (e.g. --heads-core: the 8/1 ratio only, more repeats in the time).
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 FROZENTUNE_DATA=$PWD/.gpu/data FROZENTUNE_CACHE=/tmp/ft-cache HF_HUB_OFFLINE=1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
PARTS=" ${PARTS:-extract suite} "
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
$PY --version
$PY bench/gpu_prepare.py "${MINILM:-.gpu/minilm-fp16}" /tmp/minilm /tmp/site || exit 1
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
if [[ $PARTS == *" extract "* ]]; then
  echo "== 1. extraction throughput"
  $PY bench/gpu_extract.py --device "$DEVICE" --precisions "${PRECISIONS:-fp32,bf16,fp16}" --texts "${TEXTS:-4000}" --repeats 3 --out "$OUT/gpu_extract.json"
fi
if [[ $PARTS == *" suite "* ]]; then
  echo "== 2. SST-2 suite trained on $DEVICE, each head evaluated on CPU and $DEVICE states"
  $PY bench/gpu_suite.py --device "$DEVICE" --methods "${METHODS:-probe,space,selfexplain,ytuning}" \
    --evals "${EVALS:-cpu:fp32,$DEVICE:bf16}" --out "$OUT/gpu_suite.jsonl" ${MAX_TRAIN:+--extra "--max-train $MAX_TRAIN"}
fi
if [[ $PARTS == *" graphs "* ]]; then
  echo "== 2b. the heads as CUDA graphs, checked"
  $PY bench/gpu_deps.py .gpu/serve/wheels /tmp/site &&
    FROZENTUNE_DATA=$PWD/.gpu/serve/data timeout 240 $PY bench/gpu_graphs_check.py --models .gpu/serve/models \
      --device "$DEVICE" --out "$OUT/gpu_graphs_check.json" || { echo "graphs check failed: serve part skipped"; PARTS=${PARTS/ serve / }; }
fi
if [[ $PARTS == *" rss "* ]]; then
  echo "== 2c. host memory of a 1-head and an 8-head engine"
  FROZENTUNE_DATA=$PWD/.gpu/serve/data timeout 200 $PY bench/gpu_rss_probe.py --models .gpu/serve/models --device "$DEVICE" \
    --out "$OUT/gpu_rss_probe.json"
fi
if [[ $PARTS == *" gil "* ]]; then
  echo "== 2d. the 1- and 8-head engines' batches beside a busy thread: switch intervals, one copy or one per head"
  $PY bench/gpu_deps.py .gpu/serve/wheels /tmp/site
  FROZENTUNE_DATA=$PWD/.gpu/serve/data timeout "${GIL_TIMEOUT:-240}" $PY bench/gpu_batch_gil.py --models .gpu/serve/models \
    --device "$DEVICE" --batches "${GIL_BATCHES:-100}" --switch "${GIL_SWITCH:-5,0.5,0.1}" --out "$OUT/gpu_batch_gil.json"
fi
preload_tcmalloc() {  # the servers on the carried tcmalloc where the machine has none (once per call)
  TCM=$PWD/.gpu/serve/lib/libtcmalloc_minimal.so.4
  if [[ -f $TCM && ${LD_PRELOAD:-} != *"$TCM"* ]] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
    export LD_PRELOAD=$TCM${LD_PRELOAD:+:$LD_PRELOAD}; echo "preloading the carried $TCM"
  fi
}
if [[ $PARTS == *" serve "* ]]; then
  echo "== 3. serve_load on $DEVICE"
  preload_tcmalloc
  if $PY bench/gpu_deps.py .gpu/serve/wheels /tmp/site; then
    FROZENTUNE_DATA=$PWD/.gpu/serve/data timeout "${SERVE_TIMEOUT:-330}" $PY bench/serve_load.py --only "${SERVE_PARTS:-batching,heads}" \
      --device "$DEVICE" --client raw --repeats "${SERVE_REPEATS:-1}" --seconds "${SERVE_SECONDS:-6}" --requests 20000 \
      --warm-requests "${SERVE_WARM:-1000}" --models .gpu/serve/models --twin-args "${SERVE_TWIN:---cuda-graphs off}" \
      ${SERVE_ARGS:-} --output "$OUT/serve_load_gpu.json"
    echo "serve_load exit $?"
    mkdir -p "$OUT/serve-logs" && cp .gpu/serve/serve-logs/*.log "$OUT/serve-logs/" 2>/dev/null
  fi
fi
if [[ $PARTS == *" serve-ab "* ]]; then
  echo "== 3b. serve_heads_ab on $DEVICE: the 1- and 8-head servers of this tree and of \$OLD_SRC, interleaved repeats"
  preload_tcmalloc
  $PY bench/gpu_deps.py .gpu/serve/wheels /tmp/site &&
    FROZENTUNE_DATA=$PWD/.gpu/serve/data timeout "${SERVE_TIMEOUT:-330}" $PY bench/serve_heads_ab.py --device "$DEVICE" \
      --client raw --against-src "$PWD/${OLD_SRC:?set OLD_SRC to the older src/ folder}" --against-name "${OLD_NAME:-the older src}" \
      --models .gpu/serve/models --repeats "${SERVE_REPEATS:-4}" --seconds "${SERVE_SECONDS:-5}" --requests 20000 \
      --warm-requests "${SERVE_WARM:-1000}" --output "$OUT/serve_heads_ab_gpu.json"
  echo "serve_heads_ab exit $?"
fi
if [[ $PARTS == *" extract-tmpfs "* ]]; then
  echo "== 4. extraction throughput, the cache folder on tmpfs (/dev/shm)"
  # a tmpfs with room for BERT-base's fp32 states (1.2 GB) twice: /dev/shm is often 64 MB in a container
  TMPFS=""
  for d in /dev/shm /run/shm /tmp; do
    if [[ $(stat -f -c %T "$d" 2>/dev/null) == tmpfs ]] && (( $(df -k --output=avail "$d" | tail -1) > 3000000 )); then
      TMPFS=$d; break
    fi
  done
  df -h /dev/shm /tmp
  if [[ -z $TMPFS ]]; then echo "no tmpfs with 3 GB free: part skipped"; else
  echo "tmpfs: $TMPFS"; mkdir -p "$TMPFS/ft-extract"
  TMPDIR=$TMPFS/ft-extract $PY bench/gpu_extract.py --device "$DEVICE" --precisions "${PRECISIONS:-fp32,bf16,fp16}" \
    --texts "${TEXTS:-4000}" --repeats "${EXTRACT_REPEATS:-2}" ${EXTRACT_ARGS:-} --out "$OUT/gpu_extract_tmpfs.json"
  fi
fi
if [[ $PARTS == *" extract-ab "* ]]; then
  echo "== 5. extraction throughput on tmpfs, this tree against \$OLD_SRC (a copy of an older src/), alternating processes"
  TMPFS=/dev/shm; mkdir -p "$TMPFS/ft-extract"
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for side in new old; do
      src=$PWD/src; [[ $side == old ]] && src=$PWD/${OLD_SRC:?set OLD_SRC to the older src/ folder}
      TMPDIR=$TMPFS/ft-extract PYTHONPATH=$src:/tmp/site $PY bench/gpu_extract.py --device "$DEVICE" \
        --precisions "${PRECISIONS:-fp32,bf16}" --texts "${TEXTS:-4000}" --repeats "${EXTRACT_REPEATS:-2}" \
        --out "$OUT/gpu_extract_ab_${side}_$round.json" 2>&1 | grep -v "it/s"
    done
  done
fi
echo "== done"
