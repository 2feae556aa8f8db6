cd "$(git rev-parse --show-toplevel)"  # run from the repository; .gpu/old-src: fdd7e3a's src/ (git archive)
for r in 1 2 3; do
  for side in new old; do
    src=$PWD/src; [[ $side == old ]] && src=$PWD/.gpu/old-src
    PYTHONPATH=$src OMP_NUM_THREADS=2 .venv/bin/python bench/gpu_extract.py --device cpu --threads 2 --precisions bf16 --texts 1500 --repeats 2 --out bench/runs/cpu_ab_${side}_$r.json 2>&1 | grep -v "it/s" | grep -v "^$"
  done
done
echo done
