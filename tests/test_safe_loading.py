"""Loading is safe (issue 15, section 3): saved models, checkpoints, caches and backbones load without
running code from the files.

Every loader gets a crafted malicious file: a pickle whose unpickling runs code (it writes a marker
file). Each test shows the loader refuses it with one clear line (tests/clirun.py) and that the
marker never appears. `test_the_payload_is_live` shows the payload does run when unpickled the
unsafe way, so a missing marker means the loader never ran it. Loaders and what protects them:

  classifier (model.load)            safetensors + checksum recorded in config.json
  prefix / finetune (load_tuner)     safetensors + checksum; header checked before the LM loads
  backbone / LM folder               transformers: safetensors first; a pytorch_model.bin goes
                                     through torch.load(weights_only=True)
  pretrain checkpoint                model.safetensors; optimizer.pt via torch.load(weights_only=True)
  feature cache                      raw .bin arrays (np.fromfile / mmap) + sizes and checksums
  config.json with auto_map          trust_remote_code=False unless --trust-remote-code
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clirun import cli as _cli, swap_while_loading

R_PICKLE = "a pickle that would run code, in place of any file frozentune loads (section 3)"
R_REMOTE = "a model folder that ships Python code (auto_map), without --trust-remote-code (section 3)"


def cli(*argv, **kw):
    """clirun.cli; every refusal here is recorded under the pickle row of REPORT's table."""
    if kw.get("code", 2) != 0:
        kw.setdefault("row", R_PICKLE)
    return _cli(*argv, **kw)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              # torch's weights-only unpickler warns about the raw payload's pickle protocol before refusing it
              pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")]


class Payload:
    """Unpickling this runs `exec`, which writes `marker`: what a malicious weights file would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        code = f"open({self.marker!r}, 'w').write('code ran')"
        assert len(code) <= 300, "the marker's path is too long for the fixed-size payload"
        # padded to a fixed size: the file's size (in the refusals REPORT's Bad input table records)
        # must not depend on how long this machine's temporary path is
        return exec, (code.ljust(300),)


def raw_pickle(marker: Path) -> bytes:
    return pickle.dumps({"weight": Payload(marker)})


def torch_pickle(path: Path, marker: Path) -> None:
    """The same payload in torch.save's zip format (what a .bin / .pt file normally is)."""
    torch.save({"weight": Payload(marker)}, path)


def plant(path: Path, marker: Path, kind: str) -> None:
    if kind == "torch":
        torch_pickle(path, marker)
    else:
        path.write_bytes(raw_pickle(marker))


@pytest.fixture
def marker(tmp_path) -> Path:
    m = tmp_path / "MARKER-code-ran"
    yield m
    assert not m.exists(), "the malicious file's code ran"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_payload_is_live(tmp_path):
    """Control: unpickled the unsafe way, both forms of the payload run their code."""
    m = tmp_path / "ran"
    pickle.loads(raw_pickle(m))
    assert m.read_text() == "code ran"
    m.unlink()
    torch_pickle(tmp_path / "w.pt", m)
    torch.load(tmp_path / "w.pt", weights_only=False)
    assert m.read_text() == "code ran"


def forge_checksum(folder: Path) -> None:
    """Record the planted file's checksum in config.json, as an attacker who rewrites both would."""
    from frozentune.model import file_checksum

    config = json.loads((folder / "config.json").read_text())
    config["weights_file"] = file_checksum(folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))


# ----------------------------------------------------------------------------- saved classifier
@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_bert, trec_slice) -> Path:
    root = tmp_path_factory.mktemp("classifier")
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16,
        "--epochs", 1, "--cache-dir", root / "cache", "--output", root / "model", "--quiet", code=0)
    return root / "model"


@pytest.mark.parametrize("forged", [False, True], ids=["pickle", "pickle+forged-checksum"])
@pytest.mark.parametrize("kind", ["raw", "torch"])
def test_classifier_weights_replaced_by_a_pickle(classifier, tmp_path, marker, kind, forged):
    model = tmp_path / "model"
    shutil.copytree(classifier, model)
    plant(model / "model.safetensors", marker, kind)
    if forged:
        forge_checksum(model)
    a = cli("predict", "--model", model, "How far is Paris ?",
            contains=(f"{model / 'model.safetensors'}",
                      "not a readable safetensors file" if forged else "checksum mismatch"))
    assert "Error while deserializing" in a.message or not forged  # safetensors' own words, of a file or its bytes


# ----------------------------------------------------------------------------- saved generators
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from conftest import word_tokenizer

    folder = tmp_path_factory.mktemp("tiny_llama")
    tok = word_tokenizer("name eatType food area near [ ] , the a is in".split())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def generators(tmp_path_factory, tiny_llama) -> dict[str, Path]:
    """A prefix and a fine-tuned LM saved the way a training run saves them (untrained)."""
    from frozentune.backbone import load_causal_lm
    from frozentune.generation.run import DecodeOptions, LMFinetuner
    from frozentune.generation.prefix import PrefixTuner
    from frozentune.registry import make_config

    root = tmp_path_factory.mktemp("generators")
    extra = {"task": "generation", "decoding": dataclasses.asdict(DecodeOptions(1, 4))}
    out = {}
    for method, cls in (("prefix", PrefixTuner), ("finetune", LMFinetuner)):
        lm, tok = load_causal_lm(str(tiny_llama))
        opts = {"prefix_length": 2} if method == "prefix" else {"top_layers": 1}
        cls(make_config(method, opts), lm, tok, str(tiny_llama)).save(root / method, extra=extra)
        out[method] = root / method
    return out


@pytest.mark.parametrize("method", ["prefix", "finetune"])
def test_generator_weights_replaced_by_a_pickle(generators, tmp_path, marker, method):
    model = tmp_path / method
    shutil.copytree(generators[method], model)
    cli("generate", "--model", model, "name [ the ]", code=0)  # the folder as saved works
    plant(model / "model.safetensors", marker, "torch")
    cli("generate", "--model", model, "name [ the ]", contains=("model.safetensors", "checksum mismatch"))
    forge_checksum(model)
    cli("generate", "--model", model, "name [ the ]",
        contains=(f"{model / 'model.safetensors'}", "not a readable safetensors file", "deserializing header"))
    cli("eval", "--model", model, "--data", "e2e", "--max-test", "1", contains="not a readable safetensors file")


def test_generator_loaders_refuse_a_pickle_when_called_directly(generators, tmp_path, marker, tiny_llama):
    from frozentune.backbone import load_causal_lm
    from frozentune.generation.run import LMFinetuner
    from frozentune.generation.prefix import load_prefix

    for method in ("prefix", "finetune"):
        model = tmp_path / method
        shutil.copytree(generators[method], model)
        plant(model / "model.safetensors", marker, "raw")
    with pytest.raises(Exception, match="checksum mismatch"):  # as below: the planted bytes are never parsed
        load_prefix(tmp_path / "prefix")
    forge_checksum(tmp_path / "prefix")
    with pytest.raises(Exception, match="not a readable safetensors file .*deserializing"):
        load_prefix(tmp_path / "prefix")
    lm, tok = load_causal_lm(str(tiny_llama))
    with pytest.raises(Exception, match="checksum mismatch"):  # its config.json's checksum: the bytes are not parsed
        LMFinetuner.load(tmp_path / "finetune", lm, tok)
    forge_checksum(tmp_path / "finetune")
    with pytest.raises(Exception, match="deserializing"):  # safetensors' own error: the file is never unpickled
        LMFinetuner.load(tmp_path / "finetune", lm, tok)


def test_a_generator_replaced_while_its_lm_loads_is_said_not_mixed(generators, tmp_path, monkeypatch):
    """generate read config.json (decoding options, checksum), loaded the LM for seconds, then the prefix loader
    read config.json and the weights again by path: a folder swapped in between gave one run's decoding options
    with another's prefix. Each read is now tied to the first: the swap is said."""
    from frozentune import model as M
    from frozentune.generation.run import load_tuner

    m, new = tmp_path / "m", tmp_path / "new"
    shutil.copytree(generators["prefix"], m)
    shutil.copytree(generators["prefix"], new)  # another run's prefix: other values, other decoding options
    config = swap_while_loading(monkeypatch, m, new, lambda c: c["decoding"].update(max_new_tokens=7))
    with pytest.raises(M.ModelLoadError, match="was replaced while it was being loaded .*run the command again"):
        load_tuner(m)
    monkeypatch.undo()
    tuner, _, got = load_tuner(m)  # run again: the new folder, whole
    assert got["decoding"] == config["decoding"]
    assert torch.equal(tuner.encoder.materialize(), M.load_weights(m)["prefix"])


def test_a_generator_on_an_lm_with_other_decoding_ids_is_refused(generators, tmp_path, tiny_llama):
    """The LM's eos / bos / pad / decoder-start ids are not in its config hash (they do not change a forward
    pass), so an LM folder whose config.json was edited there decoded on silently, ending its outputs elsewhere."""
    lm = tmp_path / "lm"
    shutil.copytree(tiny_llama, lm)
    for method in ("prefix", "finetune"):
        model = tmp_path / method
        shutil.copytree(generators[method], model)
        config = json.loads((model / "config.json").read_text())
        config["backbone"]["name"] = str(lm)  # the model names the copy (config.json is not in the weights checksum)
        (model / "config.json").write_text(json.dumps(config))
        cli("generate", "--model", model, "name [ the ]", code=0)
    lm_config = json.loads((lm / "config.json").read_text())
    was = lm_config.get("eos_token_id")
    lm_config["eos_token_id"] = 5 if was != 5 else 6
    (lm / "config.json").write_text(json.dumps(lm_config))
    for method in ("prefix", "finetune"):
        cli("generate", "--model", tmp_path / method, "name [ the ]",
            contains=("starts, pads or ends its outputs with other token ids",
                      f"config.eos_token_id {was} → {lm_config['eos_token_id']}"))


# ----------------------------------------------------------------------------- backbone folders
@pytest.mark.parametrize("kind", ["raw", "torch"])
def test_backbone_pytorch_model_bin_is_never_unpickled_unsafely(tiny_bert, trec_slice, tmp_path, marker, kind):
    """No model.safetensors, a pytorch_model.bin that runs code: transformers reads it with
    torch.load(weights_only=True), which refuses the call; one line, nothing cached."""
    folder = tmp_path / "evil_bert"
    shutil.copytree(tiny_bert, folder)
    (folder / "model.safetensors").unlink()
    plant(folder / "pytorch_model.bin", marker, kind)
    cli("cache", trec_slice, "--backbone", folder, "--cache-dir", tmp_path / "cache",
        contains=("pytorch_model.bin is not plain weights", "weights-only loader refused", "nothing in it was run",
                  "model.safetensors"))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_backbone_safetensors_is_preferred_over_a_pickle_beside_it(tiny_bert, trec_slice, tmp_path, marker):
    folder = tmp_path / "both"
    shutil.copytree(tiny_bert, folder)
    plant(folder / "pytorch_model.bin", marker, "torch")
    cli("cache", trec_slice, "--backbone", folder, "--cache-dir", tmp_path / "cache", "--quiet", code=0)


def test_backbone_safetensors_replaced_by_a_pickle(tiny_bert, trec_slice, tmp_path, marker):
    folder = tmp_path / "evil_bert"
    shutil.copytree(tiny_bert, folder)
    plant(folder / "model.safetensors", marker, "torch")
    cli("cache", trec_slice, "--backbone", folder, "--cache-dir", tmp_path / "cache",
        contains=("weights are not a readable safetensors file", "deserializing header"))


@pytest.mark.parametrize("kind", ["raw", "torch"])
def test_causal_lm_pytorch_model_bin_is_refused(tiny_llama, tmp_path, marker, kind):
    from frozentune.backbone import BackboneError, load_causal_lm

    folder = tmp_path / "evil_llama"
    shutil.copytree(tiny_llama, folder)
    (folder / "model.safetensors").unlink()
    plant(folder / "pytorch_model.bin", marker, kind)
    with pytest.raises(BackboneError, match="pytorch_model.bin is not plain weights"):
        load_causal_lm(str(folder))


# ----------------------------------------------------------------------------- remote code
EVIL_MODULE = '''
open({marker!r}, "w").write("code ran")
from transformers import BertConfig, BertModel

class EvilConfig(BertConfig):
    model_type = "evilnet"

class EvilModel(BertModel):
    config_class = EvilConfig
'''


@pytest.fixture
def remote_code_folder(tiny_bert, tmp_path, marker) -> Path:
    """A model whose config.json asks for its own modeling code (auto_map), which writes the marker."""
    folder = tmp_path / "remote_code"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evilnet", architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil_model.EvilConfig", "AutoModel": "evil_model.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil_model.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    return folder


def test_remote_code_is_refused_without_the_flag(remote_code_folder, trec_slice, tmp_path, marker):
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", remote_code_folder, "--epochs", 1,
        "--cache-dir", tmp_path / "cache", "--output", tmp_path / "out",
        contains=("ships its own Python code", "auto_map in config.json", "rerun with --trust-remote-code"), row=R_REMOTE)
    assert not (tmp_path / "out").exists()


def test_remote_code_runs_only_with_the_flag(remote_code_folder, trec_slice, tmp_path, marker):
    """Control (in a child process, its module cache in tmp_path): --trust-remote-code reaches
    transformers and the folder's code runs; the marker is removed again for the fixture's check."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "frozentune.cli", "cache", str(trec_slice), "--backbone",
                    str(remote_code_folder), "--trust-remote-code", "--cache-dir", str(tmp_path / "cache"),
                    "--quiet"], env=env, capture_output=True, text=True, timeout=180)
    assert marker.read_text() == "code ran"
    marker.unlink()


def test_a_custom_tokenizer_class_is_not_imported(tiny_bert, trec_slice, tmp_path, marker):
    """tokenizer_config.json naming its own class (auto_map) on a known architecture: the
    built-in tokenizer is used, the folder's code is not imported."""
    folder = tmp_path / "custom_tok"
    shutil.copytree(tiny_bert, folder)
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil_tok.EvilTokenizer", "evil_tok.EvilTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    (folder / "evil_tok.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n"
                                        f"from transformers import BertTokenizerFast as EvilTokenizer\n")
    cli("cache", trec_slice, "--backbone", folder, "--cache-dir", tmp_path / "cache", "--quiet", code=0)


# ----------------------------------------------------------------------------- pretrain checkpoints
PRETRAIN = ["--arch", "light", "--layers", 1, "--dim", 16, "--heads", 2, "--kernel-size", 3, "--ffn-dim", 32,
            "--max-length", 32, "--batch-size", 4, "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, shared_data) -> tuple[Path, Path]:
    """(corpus file, output folder of a 2-step pre-training run)."""
    root = tmp_path_factory.mktemp("pretrain")
    corpus = root / "corpus.txt"
    texts = [json.loads(line)["text"] for line in (shared_data / "trec" / "train.jsonl").read_text().splitlines()[:80]]
    corpus.write_text("\n".join(texts) + "\n")
    cli("pretrain", "--corpus", corpus, "--output", root / "ckpt", *PRETRAIN, "--steps", 2, code=0)
    return corpus, root / "ckpt"


def step_folder(ckpt: Path) -> Path:
    return ckpt / (ckpt / "latest").read_text().strip()


@pytest.mark.parametrize("kind", ["raw", "torch"])
def test_pretrain_resume_refuses_a_pickled_optimizer_state(checkpoint, tmp_path, marker, kind):
    _, saved = checkpoint
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    plant(step_folder(ckpt) / "optimizer.pt", marker, kind)
    before = tree(ckpt)
    cli("pretrain", "--output", ckpt, "--resume", "--steps", 3,
        contains=("optimizer.pt", "weights-only loader refused", "nothing in it was run", "--resume"))
    assert tree(ckpt) == before


def test_pretrain_checkpoint_weights_replaced_by_a_pickle(checkpoint, trec_slice, tmp_path, marker):
    _, saved = checkpoint
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    plant(step_folder(ckpt) / "model.safetensors", marker, "torch")
    before = tree(ckpt)
    cli("pretrain", "--output", ckpt, "--resume", "--steps", 3,
        contains=("model.safetensors", "not a readable safetensors file"))
    cli("train", "--method", "conv", "--arch", "light", "--layers", 1, "--dim", 16, "--heads", 2, "--kernel-size", 3,
        "--ffn-dim", 32, "--init", ckpt, "--data", trec_slice, "--max-length", 32, "--epochs", 1,
        "--output", tmp_path / "out", contains=("model.safetensors", "not a readable safetensors file"))
    assert tree(ckpt) == before and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- feature cache
@pytest.mark.parametrize("name", ["offsets.bin", "lengths.bin", "states.bin", "ids.bin"])
@pytest.mark.parametrize("same_size", [False, True], ids=["pickle", "pickle-padded-to-size"])
def test_feature_cache_file_replaced_by_a_pickle(tiny_bert, trec_slice, tmp_path, marker, name, same_size):
    """Cache files are raw arrays read with np.fromfile / mmap: a pickle there is only bytes, and
    the recorded sizes and checksums catch it before a row is used."""
    args = ["cache", trec_slice, "--backbone", tiny_bert, "--max-length", 16, "--cache-dir", tmp_path / "cache", "--quiet"]
    cli(*args, code=0)
    entry = next(p for p in (tmp_path / "cache").iterdir()
                 if (p / "meta.json").is_file() and json.loads((p / "meta.json").read_text())["n"] == 120)  # train
    size = (entry / name).stat().st_size
    payload = raw_pickle(marker)
    assert len(payload) < size
    (entry / name).write_bytes(payload + b"\0" * (size - len(payload)) if same_size else payload)
    cli(*args, contains=(str(entry / name), "checksum" if same_size else "truncated or overwritten", "--rebuild-cache"))
