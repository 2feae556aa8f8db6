#!/usr/bin/env bash
# Issue 16's GPU figures in one call of the device tool (a bare machine with torch + transformers):
#   .gpu/ (git-ignored, carried): minilm-fp16/ (MiniLM as fp16, 45 MB), data/sst2/ (the SST-2 files)
#   device run: bash bench/gpu_run.sh     (carry .gpu; writes $OUT/*.json and $OUT/log.txt)
# 1. bench/gpu_extract.py: tokens/s of a bare forward loop vs a full cache build, fp32/bf16/fp16,
#    MiniLM's shape and BERT-base's; 2. the SST-2 suite of heads trained on the GPU (default
#    precision, then fp32 for the probe and Y-Tuning); 3. each of
#    those heads evaluated on states made by the CPU (fp32) and by the GPU (fp32/bf16/fp16).
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 FROZENTUNE_DATA=$PWD/.gpu/data FROZENTUNE_CACHE=/tmp/ft-cache HF_HUB_OFFLINE=1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
PARTS=" ${PARTS:-extract suite} "
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
$PY bench/gpu_prepare.py .gpu/minilm-fp16 /tmp/minilm /tmp/site || exit 1
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
echo "== done"
