"""PEFT interop of prefixes: `frozentune export --format peft` writes an adapter PEFT loads and that
generates what frozentune generates, token for token; `frozentune import --format peft` brings a
PEFT-made prefix adapter back, likewise; and every adapter frozentune cannot read is a clear error.

Tiny random causal LMs saved as Hugging Face folders with a word-level tokenizer: a 3-layer Llama
with grouped-query attention (4 query heads share 2 key/value heads, so PEFT's num_attention_heads
and token_dim are the key/value ones) and a 2-layer GPT-2. initializer_range 0.2 gives them
decisive next-token distributions, so greedy ids are not decided by near-ties.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from clirun import cli
from conftest import make_tiny_llama, word_tokenizer
from frozentune.backbone import load_causal_lm
from frozentune.export.peft import from_peft, peft_generate_drops_prefix, to_peft
from frozentune.generation.prefix import PrefixBatch, PrefixConfig, PrefixTuner, encode_sources, prefix_forward, until_eos
from numerics import assert_close, exact, linear, transformer

peft = pytest.importorskip("peft", reason="PEFT interop needs the peft extra: pip install 'frozentune[peft]'")

WORDS = ("name eatType food area near pub coffee shop the is a in city centre riverside Blue Spice Aromi "
         "Cotto serves Italian English cheap there it with and . , [ ]").split()
SOURCES = ["name [ Blue Spice ] , eatType [ pub ]", "name [ Aromi ] , food [ Italian ] , area [ city centre ]",
           "name [ Cotto ] , near [ the ]"]
NEW_TOKENS = 10

pytestmark = pytest.mark.usefixtures("one_thread")


def make_tiny_gpt2(folder: Path, words: list[str], seed: int = 0) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = word_tokenizer(words)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lms(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lms")
    return {"llama": make_tiny_llama(root / "llama", WORDS), "gpt2": make_tiny_gpt2(root / "gpt2", WORDS)}


def logits_ops(layers: int, keys: int) -> int:
    """The tiny LMs' logits (width 32, FFN ≤ 128, heads of 8) over `keys` slots, and the LM head."""
    return transformer(layers, 32, 128, keys, 8) + linear(32)


def saved_prefix(lm_dir: Path, out: Path, length: int = 4, seed: int = 1, decoding: dict | None = None) -> Path:
    """A frozentune prefix model folder holding a random prefix (scaled up so it steers the LM)."""
    lm, tok = load_causal_lm(str(lm_dir))
    tuner = PrefixTuner(PrefixConfig(prefix_length=length, reparam=False), lm, tok, str(lm_dir))
    torch.manual_seed(seed)
    with torch.no_grad():
        tuner.encoder.init_from(2 * torch.randn_like(tuner.encoder.materialize()))
    tuner.save(out, extra={"task": "generation", "data": "e2e", **({"decoding": decoding} if decoding else {})})
    return out


def peft_greedy(model, ids: list[int]) -> list[int]:
    """PEFT's own generate, greedy, one prompt, up to (not including) eos."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=2)
    return until_eos(out[0, len(ids):].tolist(), 2)


def peft_forward_greedy(model, ids: list[int]) -> list[int]:
    """Greedy decoding through the PEFT model's forward calls alone (the whole sequence every step, no
    cache kept between steps): what PEFT's model computes, whatever its generate() does with caches."""
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            nxt = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[:, -1].argmax(-1, keepdim=True)
            x = torch.cat([x, nxt], 1)
            if nxt.item() == 2:
                break
    return until_eos(x[0, len(ids):].tolist(), 2)


def check_peft_generate(model, prompts: list[list[int]], expected: list[list[int]]) -> None:
    """PEFT's own generate() gives `expected` on every prompt. With the PEFT and transformers pair
    whose generate() leaves the prefix out (frozentune.export.peft.peft_generate_drops_prefix), a
    mismatch is an expected failure that names the cause; with any other pair it fails the test."""
    wrong = [i for i, (ids, want) in enumerate(zip(prompts, expected)) if peft_greedy(model, ids) != want]
    if wrong and peft_generate_drops_prefix():
        pytest.xfail(f"PeftModel.generate differs on prompts {wrong}: this PEFT ({peft.__version__}) hands the prefix "
                     f"to generate as past_key_values, which transformers >= 5.24 drops (its forward pass, checked "
                     f"above, agrees)")
    assert not wrong, f"PeftModel.generate differs from the expected tokens on prompts {wrong}"


def frozentune_greedy(folder: Path, lm_dir: Path, ids: list[int]) -> list[int]:
    lm, tok = load_causal_lm(str(lm_dir))
    return PrefixTuner.load(folder, lm, tok).generate([ids], max_new_tokens=NEW_TOKENS)[0]


def load_peft(lm_dir: Path, adapter: Path):
    from transformers import AutoModelForCausalLM

    return peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(lm_dir)), str(adapter)).eval()


# ----------------------------------------------------------------------------- layout
def test_layout_is_the_one_peft_reads(lms, tmp_path):
    """Layer n's keys and values in the cache PEFT builds from the exported adapter are frozentune's
    prefix[n, 0] and prefix[n, 1] (the permutation, not only the element count, is right)."""
    folder = saved_prefix(lms["llama"], tmp_path / "m")
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", code=0)
    model = load_peft(lms["llama"], tmp_path / "p")
    cache = model.get_prompt(batch_size=1)
    from safetensors.torch import load_file

    saved = load_file(str(folder / "model.safetensors"))["prefix"]  # (N, 2, H, P, E)
    for n, layer in enumerate(cache.layers):
        exact(layer.keys[0], saved[n, 0], "a copy: PEFT views the same numbers")
        exact(layer.values[0], saved[n, 1], "a copy: PEFT views the same numbers")
    n, _, h, _, e = saved.shape
    exact(from_peft(to_peft(saved), n, h, e), saved, "permuted and back")


# ----------------------------------------------------------------------------- frozentune → PEFT
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_export_generates_what_frozentune_generates(arch, lms, tmp_path):
    lm_dir = lms[arch]
    folder = saved_prefix(lm_dir, tmp_path / "m")
    ans = cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", code=0,
              show="PEFT prefix-tuning adapter")
    assert "PeftModel.from_pretrained" in ans.message
    assert ("PeftModel.generate() leaves the prefix out" in ans.err) == peft_generate_drops_prefix()
    cfg = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    lm, tok = load_causal_lm(str(lm_dir))
    heads = lm.config.num_key_value_heads if arch == "llama" else lm.config.num_attention_heads
    assert (cfg["peft_type"], cfg["task_type"], cfg["num_virtual_tokens"]) == ("PREFIX_TUNING", "CAUSAL_LM", 4)
    assert (cfg["num_attention_heads"], cfg["token_dim"]) == (heads, heads * 8)
    assert (tmp_path / "p" / "README.md").read_text().startswith("---\nlibrary_name: peft")
    model = load_peft(lm_dir, tmp_path / "p")
    tuner = PrefixTuner.load(folder, lm, tok)
    changed, prompts, ours_greedy = 0, encode_sources(tok, SOURCES), []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            theirs = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
            ours = prefix_forward(lm, PrefixBatch.single(tuner.encoder.materialize(), 1), x, torch.ones_like(x)).logits
            plain = lm(input_ids=x).logits
        assert_close(theirs, ours, ops=logits_ops(lm.config.num_hidden_layers, 4 + len(ids)), what="PEFT vs frozentune logits")
        changed += int((plain[0, -1].argmax() != ours[0, -1].argmax()).item())
        ours_greedy.append(tuner.generate([ids], max_new_tokens=NEW_TOKENS)[0])
        assert peft_forward_greedy(model, ids) == ours_greedy[-1]
    assert changed, "the random prefix should change some next-token choice, or the comparison shows nothing"
    check_peft_generate(model, prompts, ours_greedy)


# ----------------------------------------------------------------------------- PEFT → frozentune
@pytest.mark.parametrize("arch,projection", [("llama", True), ("gpt2", False)])
def test_import_generates_what_peft_generates(arch, projection, lms, tmp_path):
    from transformers import AutoModelForCausalLM

    lm_dir = lms[arch]
    torch.manual_seed(3)
    made = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(lm_dir)),
                               peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=5,
                                                       prefix_projection=projection, encoder_hidden_size=24))
    with torch.no_grad():  # PEFT's default init is small; a larger prefix makes the comparison meaningful
        for p in made.prompt_encoder.parameters():
            p.mul_(4.0)
    made.save_pretrained(str(tmp_path / "adapter"))
    ans = cli("import", "--format", "peft", "--adapter", tmp_path / "adapter", "--output", tmp_path / "m", code=0,
              show="imported")
    assert "5 virtual tokens" in ans.message
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["method"] == "prefix" and config["imported"]["format"] == "peft"
    # what the adapter says, nothing else: it recorded frozentune's defaults (reparam_hidden 512, init random,
    # init_text), which never made this prefix
    assert config["options"] == {"train_backbone": False, "prefix_length": 5, "reparam": projection,
                                 **({"reparam_hidden": 24} if projection else {})}
    from frozentune.api import runs_live

    runs_live("prefix", config["options"])  # serve's first reading of the options takes them (make_config)
    card = (tmp_path / "m" / "README.md").read_text()
    assert "library_name: frozentune" in card and "Imported from a PEFT adapter" in card
    assert "Not recorded (no result.json in the folder)." in card  # trained elsewhere: no metrics claimed
    model = load_peft(lm_dir, tmp_path / "adapter")
    _, tok = load_causal_lm(str(lm_dir))
    prompts = encode_sources(tok, SOURCES)
    ours_greedy = [frozentune_greedy(tmp_path / "m", lm_dir, ids) for ids in prompts]
    assert ours_greedy == [peft_forward_greedy(model, ids) for ids in prompts]
    # and back again: the same tensor PEFT saved
    cli("export", "--model", tmp_path / "m", "--format", "peft", "--output", tmp_path / "again", code=0)
    from safetensors.torch import load_file

    exact(load_file(str(tmp_path / "again" / "adapter_model.safetensors"))["prompt_embeddings"],
          load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))["prompt_embeddings"],
          "reshaped twice, never computed on")
    check_peft_generate(model, prompts, ours_greedy)


def test_round_trip_through_the_cli_generate(lms, tmp_path, capsys):
    """frozentune → PEFT → frozentune: `frozentune generate` on the imported folder prints what it
    prints on the original."""
    from frozentune.cli import main

    decoding = {"num_beams": 1, "max_new_tokens": NEW_TOKENS, "batch_size": 32}
    folder = saved_prefix(lms["llama"], tmp_path / "m", decoding=decoding)
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", code=0)
    assert "(loading checks it)" not in (tmp_path / "p" / "README.md").read_text()  # PEFT's loading checks no hash
    relative = Path(os.path.relpath(lms["llama"]))  # a local base given relative to here: saved absolute
    cli("import", "--format", "peft", "--adapter", tmp_path / "p", "--output", tmp_path / "back",
        "--backbone", relative, code=0)
    # the decoding options travel beside the adapter (they were dropped: the import decoded with the defaults)
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert saved["decoding"] == decoding
    assert saved["backbone"]["name"] == str(Path(lms["llama"]).resolve()) and Path(saved["imported"]["from"]).is_absolute()
    outs = []
    for m in (folder, tmp_path / "back"):
        capsys.readouterr()
        assert main(["generate", "--model", str(m), *SOURCES]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == len(SOURCES)


# ----------------------------------------------------------------------------- what is refused
def test_adapters_frozentune_cannot_read_are_clear_errors(lms, tmp_path):
    from transformers import AutoModelForCausalLM

    lora = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(lms["llama"])),
                               peft.LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(str(tmp_path / "lora"))
    out = tmp_path / "out"
    cli("import", "--format", "peft", "--adapter", tmp_path / "lora", "--output", out,
        contains=("LORA adapter", "prefix-tuning adapters only", "merge_and_unload"))
    # a prefix adapter for another model: the Llama's adapter onto the GPT-2
    made = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(lms["llama"])),
                               peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    made.save_pretrained(str(tmp_path / "llama_prefix"))
    cli("import", "--format", "peft", "--adapter", tmp_path / "llama_prefix", "--output", out, "--backbone", lms["gpt2"],
        contains=("made for a model with 3 layers", "Give --backbone the model it was trained on"))
    # no adapter_config.json; a pickle-only adapter; a damaged config
    (tmp_path / "empty").mkdir()
    cli("import", "--format", "peft", "--adapter", tmp_path / "empty", "--output", out, contains="no adapter_config.json")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((tmp_path / "llama_prefix" / "adapter_config.json").read_text())
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04not read")
    cli("import", "--format", "peft", "--adapter", pickled, "--output", out, contains=("a pickle", "safe_serialization"))
    (pickled / "adapter_config.json").write_text("{not json")
    cli("import", "--format", "peft", "--adapter", pickled, "--output", out, contains="not readable JSON")
    # a prefix of NaN (a damaged file, a diverged training) was imported and then generated empty strings
    from safetensors.torch import load_file, save_file

    nan = tmp_path / "nan_prefix"
    shutil.copytree(tmp_path / "llama_prefix", nan)
    state = load_file(str(nan / "adapter_model.safetensors"))
    state = {k: v.clone().fill_(float("nan")) if "prompt_embeddings" in k else v for k, v in state.items()}
    save_file(state, str(nan / "adapter_model.safetensors"))
    cli("import", "--format", "peft", "--adapter", nan, "--output", out, "--backbone", lms["llama"],
        contains=("NaN or infinite", "export or train it again"))
    # a damaged or missing adapter file said "train it again", or nothing; a base model that is not here did not
    # say it came from the adapter's config
    cut = tmp_path / "cut_prefix"
    shutil.copytree(tmp_path / "llama_prefix", cut)
    (cut / "adapter_model.safetensors").write_bytes((cut / "adapter_model.safetensors").read_bytes()[:200])
    cli("import", "--format", "peft", "--adapter", cut, "--output", out, "--backbone", lms["llama"],
        contains="the adapter file is damaged: save it again from PEFT with save_pretrained(FOLDER)")
    (cut / "adapter_model.safetensors").unlink()
    cli("import", "--format", "peft", "--adapter", cut, "--output", out, "--backbone", lms["llama"],
        contains="no adapter_model.safetensors; save it again from PEFT")
    gone = tmp_path / "gone_base"
    shutil.copytree(tmp_path / "llama_prefix", gone)
    config = json.loads((gone / "adapter_config.json").read_text())
    (gone / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "nope")}))
    cli("import", "--format", "peft", "--adapter", gone, "--output", out,
        contains="(the base model that " + str(gone / "adapter_config.json") + " names; give the LM with --backbone)")
    # a base model of another kind: a TypeError from pathlib (found by a fuzz of adapter_config.json)
    (gone / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": ["x"]}))
    cli("import", "--format", "peft", "--adapter", gone, "--output", out,
        contains=str(gone / "adapter_config.json") + ': base_model_name_or_path is ["x"], not a model id or folder')
    assert not out.exists()  # nothing was written by any refusal


def test_named_adapters_in_subfolders_are_named(lms, tmp_path):
    """PEFT saves an adapter named other than 'default' in FOLDER/NAME: --adapter FOLDER said "not a PEFT adapter
    folder", and a default adapter beside named ones was imported without a word about the others."""
    from transformers import AutoModelForCausalLM

    made = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(lms["llama"])),
                               peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2), adapter_name="e2e")
    made.save_pretrained(str(tmp_path / "named"))
    assert (tmp_path / "named" / "e2e" / "adapter_config.json").is_file()
    cli("import", "--format", "peft", "--adapter", tmp_path / "named", "--output", tmp_path / "m",
        contains=("holds adapter 'e2e'", f"give --adapter {tmp_path / 'named' / 'e2e'}"))
    assert not (tmp_path / "m").exists()
    cli("import", "--format", "peft", "--adapter", tmp_path / "named" / "e2e", "--output", tmp_path / "m", code=0)
    # the default adapter at the top and two named ones below it: the default is imported, the others named
    both = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(lms["llama"])),
                               peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    for name in ("webnlg", "dart"):
        both.add_adapter(name, peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    both.save_pretrained(str(tmp_path / "multi"))
    ans = cli("import", "--format", "peft", "--adapter", tmp_path / "multi", "--output", tmp_path / "d", code=0,
              show="also holds")
    assert "adapters 'dart', 'webnlg' in subfolders" in ans.message and "the one at its top" in ans.message
    assert f"--adapter {tmp_path / 'multi' / 'dart'}" in ans.message
    assert json.loads((tmp_path / "d" / "config.json").read_text())["prefix"]["length"] == 2  # the default one


def test_export_refuses_what_is_not_a_prefix_and_keeps_outputs(lms, tiny_bert, trec_slice, tmp_path):
    clf = tmp_path / "clf"
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--epochs", "1", "--output", clf,
        "--cache-dir", tmp_path / "c", "--quiet", code=0)
    assert (clf / "README.md").read_text().startswith("---\nlibrary_name: frozentune")
    cli("export", "--model", clf, "--format", "peft", "--output", tmp_path / "p",
        contains=("'probe' classifier", "prefix-tuning adapters"))
    empty = saved_prefix(lms["llama"], tmp_path / "zero", length=0)
    cli("export", "--model", empty, "--format", "peft", "--output", tmp_path / "p", contains="0 positions")
    folder = saved_prefix(lms["llama"], tmp_path / "m")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    cli("export", "--model", folder, "--format", "peft", "--output", busy, contains="is not empty")
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", code=0)
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", contains="--overwrite")
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", "--overwrite", code=0)
    cli("export", "--model", folder, "--format", "peft", "--output", folder, "--overwrite",
        contains="the command reads")  # it replaced the prefix with its own adapter
    assert (folder / "model.safetensors").is_file()
    cli("import", "--format", "peft", "--adapter", tmp_path / "p", "--output", tmp_path / "p", "--overwrite",
        contains="the command reads")
    # a masked LM given as the causal LM: transformers made a BertLMHeadModel (its LM head newly initialised), the
    # import wrote a folder that generate then refused
    cli("import", "--format", "peft", "--adapter", tmp_path / "p", "--output", tmp_path / "onbert", "--backbone",
        tiny_bert, contains="an encoder (a masked LM), not a causal LM")
    assert not (tmp_path / "onbert").exists()
    # a decoding value edited in the file beside the adapter: the message blamed --num-beams, never given
    (tmp_path / "p" / "frozentune_decoding.json").write_text(json.dumps({"decoding": {"num_beams": 0}}))
    cli("import", "--format", "peft", "--adapter", tmp_path / "p", "--output", tmp_path / "dec",
        contains=("frozentune_decoding.json: --num-beams 0: must be at least 1 (a value in this file",
                  "remove the file to decode with the defaults"))
    # a prefix inside a frozen encoder classifies: it was read as a damaged prefix file ("expected one tensor")
    enc = tmp_path / "enc-prefix"
    cli("train", "--method", "prefix", "--data", trec_slice, "--backbone", tiny_bert, "--epochs", "1", "--output", enc,
        "--max-length", "16", "--quiet", code=0)
    cli("export", "--model", enc, "--format", "peft", "--output", tmp_path / "q",
        contains="'prefix' classifier (a prefix inside a frozen encoder)")


def test_a_model_that_is_no_causal_lm_is_named_before_transformers_refuses_it(lms, tmp_path):
    """AutoModelForCausalLM refuses a T5 or a DistilBERT folder with its own words (the list of every config class
    it knows, cut mid-word); the kind is read from config.json first, for import and for train alike."""
    from transformers import DistilBertConfig, DistilBertModel

    from conftest import make_t5

    tok = word_tokenizer(WORDS)
    make_t5(len(tok)).save_pretrained(tmp_path / "t5")
    tok.save_pretrained(tmp_path / "t5")
    folder = saved_prefix(lms["llama"], tmp_path / "m")
    cli("export", "--model", folder, "--format", "peft", "--output", tmp_path / "p", code=0)
    cli("import", "--format", "peft", "--adapter", tmp_path / "p", "--output", tmp_path / "ont5", "--backbone",
        tmp_path / "t5", contains=("an encoder-decoder LM (t5)", "needs a causal (decoder-only) LM"))
    assert not (tmp_path / "ont5").exists()
    DistilBertModel(DistilBertConfig(vocab_size=len(tok), dim=32, n_layers=1, n_heads=4, hidden_dim=64,
                                     max_position_embeddings=64)).save_pretrained(tmp_path / "distil")
    tok.save_pretrained(tmp_path / "distil")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"source": f"name [ Aromi ] {i}", "target": "Aromi is a pub ."}) + "\n"
                             for i in range(8)))
    cli("train", "--method", "prefix", "--data", pairs, "--backbone", tmp_path / "distil", "--epochs", "1",
        "--output", tmp_path / "g", contains=("an encoder (a masked LM), not a causal LM (distilbert)",))
    assert not (tmp_path / "g").exists()


def test_an_adapter_exported_from_a_cache_that_moved_finds_its_alias(tmp_path):
    """export writes the alias's folder (PEFT can load it) as base_model_name_or_path; after the cache moved, or on
    another machine, import failed on that path. A missing <cache>/models/<alias> folder is read as the alias."""
    from frozentune.export.peft import alias_of

    assert alias_of(str(tmp_path / "gone" / "models" / "smollm2-135m")) == "smollm2-135m"
    assert alias_of(str(tmp_path)) is None  # a folder that is there is used as it is
    assert alias_of("smollm2-135m") is None and alias_of(str(tmp_path / "models" / "gpt2")) is None
