"""PEFT round trips on SmolLM2-135M and E2E (issue 18): generation token for token, greedy.

  OMP_NUM_THREADS=1 python bench/peft_roundtrip.py            # results/peft_roundtrip.json and .md

1. frozentune → PEFT. A prefix trained here (`frozentune train --method prefix --init words --data
   e2e --max-train 100 --epochs 2`, into bench/runs/peft-e2e-prefix, trained once) is exported with
   `frozentune export --format peft`; PeftModel.from_pretrained loads it on the same LM, and both
   decode the first --sources E2E test sources greedily, one prompt at a time (the prompt: the
   source's tokens, then bos). Counted: identical token sequences; reported: the largest logit
   difference on the prompts.
2. PEFT → frozentune. A prefix adapter made and trained by PEFT itself (get_peft_model with
   PrefixTuningConfig, its projection MLP, --peft-steps AdamW steps on E2E dev pairs in the same
   prompt format), saved by save_pretrained, imported with `frozentune import --format peft`, and
   decoded by both the same way.
3. Back again: the imported folder exported once more holds the same prompt_embeddings tensor.

The LM runs in fp32 on the CPU, 1 thread unless --threads.
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import write_result  # noqa: E402  (bench/run.py)
RUNS = HERE / "runs"
OUT = HERE / "results" / "peft_roundtrip"
TRAIN = ["--method", "prefix", "--init", "words", "--data", "e2e", "--max-train", "100", "--max-validation", "50",
         "--epochs", "2", "--max-test", "10", "--num-beams", "1", "--seed", "0"]


def frozentune(*args: str) -> None:
    exe = str(Path(sys.executable).parent / "frozentune")
    proc = subprocess.run([exe, *map(str, args)], text=True, capture_output=True)
    if proc.returncode:
        raise SystemExit(f"frozentune {' '.join(map(str, args))} failed:\n{proc.stderr}")
    print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "", flush=True)


def greedy_pair(tuner, peft_model, prompts: list[list[int]], new_tokens: int, eos: int, pad: int) -> dict:
    """Both decoders on each prompt alone; identical rows and the largest prompt-logit difference."""
    from frozentune.generation.prefix import PrefixBatch, prefix_forward, until_eos

    same, worst, first_diff = 0, 0.0, None
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids])
        with torch.no_grad():
            ours = tuner.generate([ids], max_new_tokens=new_tokens)[0]
            out = peft_model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                      do_sample=False, num_beams=1, pad_token_id=pad, eos_token_id=eos)
            theirs = until_eos(out[0, len(ids):].tolist(), eos)
            a = prefix_forward(tuner.lm, PrefixBatch.single(tuner.encoder.materialize(), 1), x, torch.ones_like(x)).logits
            b = peft_model(input_ids=x, attention_mask=torch.ones_like(x)).logits
        worst = max(worst, float((a - b).abs().max()))
        if ours == theirs:
            same += 1
        elif first_diff is None:
            first_diff = {"prompt": i, "frozentune": ours, "peft": theirs}
    return {"prompts": len(prompts), "identical": same, "max_abs_logit_diff": worst, "first_difference": first_diff}


def train_with_peft(lm_name: str, steps: int, seed: int, log) -> Path:
    """A PEFT prefix adapter (projection MLP on, 10 virtual tokens) trained by PEFT on E2E dev pairs."""
    from peft import PrefixTuningConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from frozentune.backbone import LM_ALIASES, load_causal_lm
    from frozentune.data import load_generation
    from frozentune.generation.run import encode_pairs
    from frozentune.generation.prefix import pack_pairs

    out = RUNS / f"peft-made-prefix-{steps}"
    if (out / "adapter_model.safetensors").is_file():
        return out
    path = LM_ALIASES[lm_name]() if lm_name in LM_ALIASES else lm_name
    _, tok = load_causal_lm(lm_name)
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=10, prefix_projection=True))
    pairs = [(ex.source, ex.refs[0]) for ex in load_generation("e2e", "validation")[:400]]
    sources, targets = encode_pairs(tok, pairs)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    g = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(len(pairs), (8,), generator=g).tolist()
        ids, mask, labels = pack_pairs([sources[i] for i in idx], [targets[i] for i in idx], pad)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            log(f"  PEFT training step {step + 1}/{steps}: loss {loss.item():.3f} ({time.perf_counter() - t0:.0f}s)")
    model.save_pretrained(str(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", type=int, default=50, help="E2E test sources decoded by both sides")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--peft-steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import peft
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from frozentune.backbone import LM_ALIASES, load_causal_lm
    from frozentune.data import load_generation
    from frozentune.export.peft import peft_generate_drops_prefix
    from frozentune.generation.prefix import PrefixTuner, encode_sources

    if peft_generate_drops_prefix():
        sys.exit(f"peft {peft.__version__} with this transformers (>= 5.24): PeftModel.generate leaves the prefix out "
                 f"(README, 'Taking a model elsewhere'), so this round trip would measure that bug; run it with "
                 f"transformers < 5.24 or a PEFT release after 0.21.2")
    lm_name = "smollm2-135m"
    lm_path = LM_ALIASES[lm_name]()
    trained = RUNS / "peft-e2e-prefix"
    if not (trained / "model.safetensors").is_file():
        print(f"training a prefix into {trained}", flush=True)
        frozentune("train", *TRAIN, "--output", trained)
    exported, imported, again = (RUNS / f"peft-roundtrip-{n}" for n in ("exported", "imported", "again"))
    frozentune("export", "--model", trained, "--format", "peft", "--output", exported, "--overwrite")
    lm, tok = load_causal_lm(lm_name)
    sources = [ex.source for ex in load_generation("e2e", "test")[:a.sources]]
    prompts = encode_sources(tok, sources)
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def peft_on(adapter: Path):
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm_path, dtype=torch.float32),
                                         str(adapter)).eval()

    t0 = time.perf_counter()
    forward = greedy_pair(PrefixTuner.load(trained, lm, tok), peft_on(exported), prompts, a.new_tokens, eos, pad)
    forward["seconds"] = time.perf_counter() - t0
    print(f"frozentune → PEFT: {forward['identical']}/{forward['prompts']} identical", flush=True)

    made = train_with_peft(lm_name, a.peft_steps, 0, lambda s: print(s, flush=True))
    frozentune("import", "--format", "peft", "--adapter", made, "--output", imported, "--overwrite")
    t0 = time.perf_counter()
    backward = greedy_pair(PrefixTuner.load(imported, lm, tok), peft_on(made), prompts, a.new_tokens, eos, pad)
    backward["seconds"] = time.perf_counter() - t0
    print(f"PEFT → frozentune: {backward['identical']}/{backward['prompts']} identical", flush=True)

    frozentune("export", "--model", imported, "--format", "peft", "--output", again, "--overwrite")
    from safetensors.torch import load_file
    same_tensor = bool(torch.equal(load_file(str(again / "adapter_model.safetensors"))["prompt_embeddings"],
                                   load_file(str(made / "adapter_model.safetensors"))["prompt_embeddings"]))
    example = tok.decode(PrefixTuner.load(imported, lm, tok).generate([prompts[0]], max_new_tokens=a.new_tokens)[0],
                         skip_special_tokens=True)
    result = {"lm": lm_name, "data": f"E2E test, first {len(prompts)} sources", "greedy_new_tokens": a.new_tokens,
              "frozentune_to_peft": forward, "peft_to_frozentune": backward,
              "reexport_same_tensor": same_tensor, "peft_trained_example": {"source": sources[0], "output": example},
              "trained_prefix_command": "frozentune train " + " ".join(TRAIN), "peft_steps": a.peft_steps,
              "peft_version": peft.__version__, "torch": torch.__version__, "threads": a.threads,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
              "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": "python bench/peft_roundtrip.py " + " ".join(sys.argv[1:])}
    md = (f"| direction | prompts | identical greedy outputs | max abs logit difference on the prompts |\n|---|---:|---:|---:|\n"
          f"| frozentune → PEFT (prefix trained here) | {forward['prompts']} | {forward['identical']} | {forward['max_abs_logit_diff']:.2e} |\n"
          f"| PEFT → frozentune (prefix trained by PEFT, {a.peft_steps} steps) | {backward['prompts']} | {backward['identical']} | {backward['max_abs_logit_diff']:.2e} |\n\n"
          f"Imported and exported again: the same prompt_embeddings tensor: {same_tensor}. "
          f"SmolLM2-135M (smollm2-135m), fp32, greedy, up to {a.new_tokens} new tokens, one prompt at a time; "
          f"PEFT {peft.__version__}, torch {torch.__version__}, {a.threads} thread(s), {result['date']}. "
          f"`{result['command'].strip()}`\n")
    write_result(OUT, result, md)


if __name__ == "__main__":
    main()
