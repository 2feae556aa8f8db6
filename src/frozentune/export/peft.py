"""Prefixes to and from Hugging Face PEFT's prefix-tuning adapters.

A PEFT prefix-tuning adapter folder holds adapter_config.json (peft_type PREFIX_TUNING; the
prefix's num_virtual_tokens P, num_layers N, num_attention_heads H — the key/value heads, PEFT
rewrites it so for grouped-query attention — and token_dim K = H·E) and
adapter_model.safetensors with one tensor, `prompt_embeddings` (P, N·2·K): the materialised prefix,
whatever parameterisation trained it. PEFT reads row p as (layer, key|value, head, dim), i.e.
`view(P, N·2, H, E)` and layer n's keys at 2n, values at 2n+1 (`PeftModel.get_prompt`). frozentune's
prefix is (N, 2, H, P, E), so the conversion is a permute and a reshape, nothing learnt changes.

Both sides place the first real token after the P prefix slots (position P), so the same prompt ids
give the same logits: the round trip is tested token for token (tests/test_export_peft.py).

Only causal-LM prefixes are converted. An encoder-decoder prefix is not, either way (SEQ2SEQ_LAYOUTS says
why): PEFT's SEQ_2_SEQ_LM adapter is one prefix that PEFT applies to the decoder's self-attention alone, as
cached past tokens, while frozentune's are three (encoder, decoder, cross-attention) without positions.
Measured on tiny BART and T5 with PEFT 0.21.2 and transformers 5.24: the encoder's output is the bare
model's, the cross-attention part is replaced by an empty cache, decoder layer i reads the rows PEFT saved
for its layer 2i mod N (it duplicates the tensor and cuts it in fours), and BART's decoder positions start
at num_virtual_tokens; a decoder-only frozentune prefix so placed matched PEFT's logits exactly only with
the positions moved too, which frozentune's encoder-decoder prefixes never do.

The `peft` package is needed to write adapter_config.json (`pip install 'frozentune[peft]'`), so the
file is the one the installed PEFT reads; reading an adapter needs only safetensors and JSON.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from . import ExportError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_KEY = "prompt_embeddings"  # PEFT's name for the materialised prompt / prefix
SEQ2SEQ_LAYOUTS = (  # why encoder-decoder prefixes do not convert (PEFT 0.21.2, transformers 5.24)
    "PEFT's SEQ_2_SEQ_LM adapter holds one prefix (prompt_embeddings of num_virtual_tokens × "
    "num_layers·2·token_dim) that PEFT puts in the decoder's self-attention only, as past tokens (the encoder gets "
    "none, the cross-attention none, and BART's learned decoder positions move by num_virtual_tokens); frozentune's "
    "encoder-decoder prefix is three prefixes, for the encoder's self-attention, the decoder's self-attention and "
    "the cross-attention, that take no positions, so neither converts to the other exactly")


# ----------------------------------------------------------------------------- the tensor
def to_peft(prefix: Tensor) -> Tensor:
    """frozentune's prefix (N, 2, H, P, E) → PEFT's prompt_embeddings (P, N·2·H·E)."""
    n, two, h, p, e = prefix.shape
    return prefix.permute(3, 0, 1, 2, 4).reshape(p, n * two * h * e).contiguous()


def from_peft(flat: Tensor, layers: int, heads: int, head_dim: int) -> Tensor:
    """PEFT's prompt_embeddings (P, N·2·H·E) → frozentune's prefix (N, 2, H, P, E)."""
    p = flat.shape[0]
    return flat.reshape(p, layers, 2, heads, head_dim).permute(1, 2, 3, 0, 4).contiguous()


# ----------------------------------------------------------------------------- a peer's known bug
def peft_generate_drops_prefix() -> bool:
    """True for the installed PEFT and transformers when `PeftModel.generate` runs without the prefix.

    transformers 5.24 renamed generate's key/value cache keyword from `past_key_values` to `cache`.
    PEFT up to 0.21.2 still hands the prefix to generate as `past_key_values`, next to the empty
    `cache` generate made, and the model keeps `cache`: the adapter's forward pass is right, its
    generate() is the bare LM's. Seen with PEFT 0.21.2 and transformers 5.24.0
    (tests/test_export_peft.py); PEFT releases after 0.21.2 are assumed to follow the rename, and
    the tests check that assumption each time they run."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        peft = Version(version("peft"))
    except PackageNotFoundError:
        return False
    return Version(version("transformers")) >= Version("5.24") and peft <= Version("0.21.2")


# ----------------------------------------------------------------------------- export
def base_model_path(name: str) -> str:
    """What PEFT's `base_model_name_or_path` should say for a frozentune LM name: an alias
    (smollm2-135m) becomes the folder it stands for, which PEFT and transformers can load; a folder
    here given by a relative path (a model saved before 2026-11-27) becomes absolute; a Hub id or an
    absolute folder stays as it is."""
    from ..backbone import LM_ALIASES, as_saved

    return LM_ALIASES[name]() if name in LM_ALIASES else as_saved(name, LM_ALIASES)


DECODING = "frozentune_decoding.json"  # beside an exported adapter: the decoding options the model was trained with


def _read_decoding(path: Path) -> dict | None:
    """The decoding options an export wrote beside the adapter, or None (PEFT's own adapters have none;
    an unreadable file is an ExportError naming it)."""
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())["decoding"]
        if not isinstance(saved, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise ExportError(f"{path}: not the decoding options frozentune's export writes; remove it to decode with "
                          f"the defaults") from None
    return saved


def alias_of(path: str) -> str | None:
    """The frozentune LM alias whose folder `path` was (base_model_path wrote it), where that folder
    is gone, e.g. the cache moved or another machine: `<cache>/models/smollm2-135m`. None otherwise."""
    from ..backbone import LM_ALIASES

    p = Path(path)
    if p.exists() or not p.is_absolute() or p.parent.name != "models" or p.name not in LM_ALIASES:
        return None
    return p.name


def peft_config(prefix_shape: tuple[int, ...], base: str) -> Any:
    """PEFT's PrefixTuningConfig for a prefix (N, 2, H, P, E) of the causal LM `base`, stored as the
    materialised prefix (prefix_projection off, inference mode)."""
    try:
        from peft import PrefixTuningConfig
    except ImportError:
        raise ExportError("--format peft needs the peft package: pip install 'frozentune[peft]' "
                          "(or pip install peft)") from None
    n, _, h, p, e = prefix_shape
    return PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=p, num_layers=n, num_attention_heads=h,
                              token_dim=h * e, encoder_hidden_size=h * e, prefix_projection=False,
                              inference_mode=True, base_model_name_or_path=base)


def export_peft(model_dir: Path, output: Path, overwrite: bool = False,
                log: Callable[[str], None] = print) -> dict:
    """Write the prefix saved in `model_dir` (a `frozentune train --method prefix` output) as a
    PEFT adapter folder `output` that `PeftModel.from_pretrained(lm, output)` loads. Returns a
    summary. The folder is written whole or not at all."""
    from ..backbone import _in_hub_cache
    from ..model import relative_name, save_tensors
    from ..output import check_output, staged_output
    from .card import read_result, write_card

    model_dir, output = Path(model_dir), Path(output)
    prefix, config = _saved_prefix(model_dir)
    n, _, h, p, e = prefix.shape
    if p == 0:
        raise ExportError(f"{model_dir}: the prefix has 0 positions, which a PEFT adapter cannot hold "
                          f"(num_virtual_tokens must be at least 1); train with --prefix-length 1 or more")
    check_output(output, overwrite, reads=[model_dir], kind="peft")
    base = base_model_path(config["backbone"]["name"])
    relative = relative_name(model_dir, base, f"It is written to base_model_name_or_path as it is: export from the "
                             f"folder training ran in, or set base_model_name_or_path in {output / ADAPTER_CONFIG} to "
                             f"that folder's absolute path", "language model")
    cfg = peft_config(tuple(prefix.shape), base)
    flat = to_peft(prefix.float())
    with staged_output(output, overwrite, kind="peft") as folder:
        cfg.save_pretrained(str(folder))
        save_tensors({PEFT_KEY: flat}, folder / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        write_card(folder, config, read_result(model_dir), exported={"format": "peft", "from": str(model_dir),
                                                                   "base_model_name_or_path": base})
        if config.get("decoding"):  # PEFT's config has no place for them; import reads them back
            (folder / DECODING).write_text(json.dumps({"decoding": config["decoding"]}, indent=1))
    summary = {"format": "peft", "output": str(output), "base_model_name_or_path": base,
               "num_virtual_tokens": p, "num_layers": n, "kv_heads": h, "head_dim": e,
               "prompt_embeddings": list(flat.shape)}
    log(f"wrote a PEFT prefix-tuning adapter to {output}: {p} virtual tokens × {n} layers × 2 × {h} kv heads × "
        f"{e} dims (prompt_embeddings {tuple(flat.shape)}), base model {base}. Load it with "
        f"peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}), {str(output)!r})")
    if relative is not None and not _in_hub_cache(base):  # a hub id the cache has is one
        log(f"note: {relative}")
    if peft_generate_drops_prefix():
        log("warning: with the installed PEFT and transformers (>= 5.24), PeftModel.generate() leaves the prefix "
            "out (its forward pass keeps it). Generate with `frozentune generate --model` on this model, or with "
            "transformers < 5.24, until a PEFT release after 0.21.2 follows transformers' `cache` rename")
    return summary


def _saved_prefix(model_dir: Path) -> tuple[Tensor, dict]:
    """(prefix, config.json) of a saved prefix model, or an ExportError that says what the folder is."""
    from ..model import read_saved
    from ..generation.prefix import load_prefix

    config = read_saved(model_dir, "the --output folder of `frozentune train --method prefix`")
    method = config.get("method")
    if method != "prefix" or config.get("task") != "generation":  # a prefix in a frozen encoder classifies
        kind = ("text generator" if config.get("task") == "generation" else
                "classifier (a prefix inside a frozen encoder)" if method == "prefix" else "classifier")
        raise ExportError(f"{model_dir}: holds a {method!r} {kind}; --format peft writes prefix-tuning adapters "
                          f"of a causal LM, i.e. models trained with --method prefix on a generation dataset")
    if config.get("architecture") == "encoder-decoder":
        raise ExportError(f"{model_dir}: an encoder-decoder prefix, which has no exact PEFT form: {SEQ2SEQ_LAYOUTS}. "
                          f"Keep using it with frozentune: generate --model {model_dir}, eval --model {model_dir}, "
                          f"serve {model_dir}")
    prefix, _, config = load_prefix(model_dir)
    return prefix, config


# ----------------------------------------------------------------------------- import
SAVE_AGAIN = "save it again from PEFT with save_pretrained(FOLDER) (safetensors, its default)"  # a missing / damaged file


def _not_causal(path: Path, cfg: dict) -> ExportError:
    """The refusal of a prefix-tuning adapter whose task_type is not CAUSAL_LM, saying why and what to do."""
    task, base = cfg.get("task_type"), cfg.get("base_model_name_or_path") or "MODEL"
    if task == "SEQ_2_SEQ_LM":
        return ExportError(f"{path}: a prefix-tuning adapter of an encoder-decoder LM. {SEQ2SEQ_LAYOUTS}. Train "
                           f"frozentune's own on that model: frozentune train --method prefix --backbone {base} "
                           f"--data YOUR_PAIRS --output DIR")
    return ExportError(f"{path}: a prefix-tuning adapter for task_type {task}; frozentune imports the prefix adapters "
                       f"of causal LMs (task_type CAUSAL_LM) only. Train a prefix here instead: "
                       f"frozentune train --method prefix --backbone {base} --data YOUR_DATA --output DIR")


def named_adapters(folder: Path) -> list[str]:
    """Names of the adapters in subfolders of `folder`: PEFT's save_pretrained writes an adapter named other than
    "default" (get_peft_model(..., adapter_name=NAME), add_adapter) to FOLDER/NAME."""
    try:
        return sorted(p.name for p in Path(folder).iterdir() if (p / ADAPTER_CONFIG).is_file())
    except OSError:
        return []


def _in_subfolders(names: list[str]) -> str:
    """"adapter 'e2e' in a subfolder" / "adapters 'a', 'b' in subfolders"."""
    quoted = ", ".join(repr(n) for n in names)
    return f"adapter {quoted} in a subfolder" if len(names) == 1 else f"adapters {quoted} in subfolders"


def _adapter_flag(folder: Path, names: list[str]) -> str:
    """The --adapter that picks the first of the named adapters in `folder`."""
    return f"--adapter {folder / names[0]}" + (f" (or another name in place of {names[0]!r})" if len(names) > 1 else "")


def read_peft_adapter(adapter_dir: Path) -> tuple[dict, Tensor]:
    """(adapter_config.json, prompt_embeddings (P, N·2·K)) of a PEFT prefix-tuning adapter for a
    causal LM, checked: anything else is an ExportError that says what it is and what to do."""
    from ..model import read_safetensors

    adapter_dir = Path(adapter_dir)
    if not adapter_dir.is_dir():
        raise ExportError(f"--adapter {adapter_dir}: not a folder; give the folder PEFT's save_pretrained wrote "
                          f"({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    path = adapter_dir / ADAPTER_CONFIG
    if not path.is_file():
        if named := named_adapters(adapter_dir):  # PEFT saved named adapters, each in its own subfolder
            raise ExportError(f"--adapter {adapter_dir}: no {ADAPTER_CONFIG} at its top, but it holds "
                              f"{_in_subfolders(named)} (PEFT saves an adapter named other than 'default' in "
                              f"FOLDER/NAME): give {_adapter_flag(adapter_dir, named)}")
        raise ExportError(f"--adapter {adapter_dir}: no {ADAPTER_CONFIG}, so not a PEFT adapter folder; give the "
                          f"folder PEFT's save_pretrained wrote")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not readable JSON ({e}); the adapter folder is damaged: save it again") from None
    if not isinstance(cfg, dict):
        raise ExportError(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    kind, task = cfg.get("peft_type"), cfg.get("task_type")
    if kind != "PREFIX_TUNING":
        hint = (" LoRA changes the model's weight matrices rather than adding prefixes; merge it into the model with "
                "PEFT's merge_and_unload() and use the merged model as a backbone instead"
                if str(kind).upper() == "LORA" else "")
        raise ExportError(f"{path}: a {kind} adapter; frozentune reads PEFT prefix-tuning adapters only "
                          f"(peft_type PREFIX_TUNING).{hint}")
    if task != "CAUSAL_LM":
        raise _not_causal(path, cfg)
    if (cfg.get("num_transformer_submodules") or 1) != 1:
        raise ExportError(f"{path}: num_transformer_submodules={cfg['num_transformer_submodules']}; a causal LM's "
                          f"prefix has one (an encoder-decoder adapter has two)")
    for key in ("num_virtual_tokens", "num_layers", "num_attention_heads", "token_dim"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise ExportError(f"{path}: {key} is {cfg.get(key)!r}; expected a positive integer (PEFT fills it in "
                              f"when the adapter is created on a model, and saves it)")
    if cfg["token_dim"] % cfg["num_attention_heads"]:
        raise ExportError(f"{path}: token_dim {cfg['token_dim']} is not a multiple of num_attention_heads "
                          f"{cfg['num_attention_heads']}")
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        other = " (it has adapter_model.bin, a pickle, which frozentune does not unpickle: re-save the adapter " \
                "with save_pretrained(..., safe_serialization=True))" if (adapter_dir / "adapter_model.bin").exists() else ""
        raise ExportError(f"--adapter {adapter_dir}: no {ADAPTER_WEIGHTS}{other or '; ' + SAVE_AGAIN}")
    state = read_safetensors(weights, ExportError, then=f"the adapter file is damaged: {SAVE_AGAIN}")
    if PEFT_KEY not in state:
        raise ExportError(f"{weights}: no {PEFT_KEY!r} tensor (found {sorted(state)[:5]}); not a prefix-tuning "
                          f"adapter as PEFT saves one")
    flat = state[PEFT_KEY]
    want = (cfg["num_virtual_tokens"], cfg["num_layers"] * 2 * cfg["token_dim"])
    if tuple(flat.shape) != want:
        raise ExportError(f"{weights}: {PEFT_KEY} has shape {tuple(flat.shape)}; adapter_config.json says {want} "
                          f"(num_virtual_tokens, num_layers·2·token_dim); the folder is inconsistent")
    if not bool(torch.isfinite(flat).all()):
        bad = int((~torch.isfinite(flat)).sum())
        raise ExportError(f"{weights}: {PEFT_KEY} holds {bad} of {flat.numel()} values that are NaN or infinite; a "
                          f"prefix made of them generates nothing useful (the adapter is damaged, or its training "
                          f"diverged): export or train it again")
    return cfg, flat.float()


def imported_options(cfg: dict, length: int) -> dict:
    """The prefix options an imported adapter's config.json records: only what adapter_config.json says (its
    length; whether PEFT's projection MLP trained it, and that MLP's width, encoder_hidden_size). frozentune's
    other training options (init, init_text) did not make this prefix, so they are left out, not defaulted."""
    projection = bool(cfg.get("prefix_projection"))
    options: dict = {"train_backbone": False, "prefix_length": length, "reparam": projection}
    width = cfg.get("encoder_hidden_size")
    if projection and type(width) is int and width > 0:  # PEFT: Linear(token_dim, width) → tanh → Linear(width, ·)
        options["reparam_hidden"] = width
    return options


def import_peft(adapter_dir: Path, output: Path, backbone: str | None = None, overwrite: bool = False,
                log: Callable[[str], None] = print) -> dict:
    """A PEFT prefix-tuning adapter → a frozentune prefix model folder (`generate`, `eval` and
    `serve` then work on it). The LM is `backbone`, else the adapter's base_model_name_or_path; its
    key/value shape must match the adapter's, and its weights hash is recorded as for a trained
    prefix."""
    import dataclasses

    from ..backbone import BackboneError, load_causal_lm
    from ..data import DataError
    from ..generation.run import DecodeOptions
    from ..output import check_output, staged_output
    from ..generation.prefix import KVShape, PrefixConfig, save_prefix
    from .card import write_card_from_files

    adapter_dir, output = Path(adapter_dir), Path(output)
    cfg, flat = read_peft_adapter(adapter_dir)
    check_output(output, overwrite, reads=[adapter_dir])
    name = backbone or cfg.get("base_model_name_or_path")
    if not name:
        raise ExportError(f"{adapter_dir / ADAPTER_CONFIG}: no base_model_name_or_path; give the LM the adapter was "
                          f"trained on with --backbone")
    if not isinstance(name, str):  # (it failed in pathlib with a TypeError)
        raise ExportError(f"{adapter_dir / ADAPTER_CONFIG}: base_model_name_or_path is {json.dumps(name)[:60]}, not a "
                          f"model id or folder; correct it, or give the LM the adapter was trained on with --backbone")
    if backbone is None and (alias := alias_of(name)) is not None:  # exported from frozentune's alias on another cache
        log(f"note: the adapter names {name}, which is not here; it is the folder of frozentune's {alias}, used instead "
            f"(its key/value shape is checked below)")
        name = alias
    if Path(name).expanduser().exists():  # a local folder, saved absolute: the folder works from anywhere
        name = str(Path(name).expanduser().resolve())
    try:
        lm, _ = load_causal_lm(name)
    except BackboneError as e:
        if backbone is not None:
            raise
        raise ExportError(f"{e} (the base model that {adapter_dir / ADAPTER_CONFIG} names; give the LM with "
                          f"--backbone)") from None
    n, h, k = cfg["num_layers"], cfg["num_attention_heads"], cfg["token_dim"]
    shape = KVShape.from_config(lm.config)
    if (n, h, k // h) != (shape.layers, shape.heads, shape.head_dim):
        raise ExportError(f"--adapter {adapter_dir}: made for a model with {n} layers × {h} key/value heads × "
                          f"{k // h} dims; {name} has {shape.layers} × {shape.heads} × {shape.head_dim}. Give "
                          f"--backbone the model it was trained on (the adapter names "
                          f"{cfg.get('base_model_name_or_path') or 'none'})")
    if backbone and cfg.get("base_model_name_or_path") and backbone != cfg["base_model_name_or_path"]:
        log(f"note: the adapter names {cfg['base_model_name_or_path']} as its base model; using --backbone "
            f"{backbone}, which has the same key/value shape")
    prefix = from_peft(flat, n, h, k // h)
    options = imported_options(cfg, int(prefix.shape[3]))
    imported = {"format": "peft", "from": str(adapter_dir.resolve()), "peft_version": cfg.get("peft_version"),
                "base_model_name_or_path": cfg.get("base_model_name_or_path")}
    decoding = dataclasses.asdict(DecodeOptions())
    saved = _read_decoding(adapter_dir / DECODING)
    if saved is not None:  # exported by frozentune: decode as the model it came from did
        try:
            decoding = dataclasses.asdict(DecodeOptions(**{k: v for k, v in saved.items() if k in decoding}).validate())
        except DataError as e:  # its words name the command line's flags, which the user did not give
            raise ExportError(f"{adapter_dir / DECODING}: {e} (a value in this file, which frozentune's export "
                              f"wrote); restore it, or remove the file to decode with the defaults") from None
    with staged_output(output, overwrite) as folder:
        save_prefix(folder, prefix, PrefixConfig(prefix_length=int(prefix.shape[3]), reparam=False), name,
                    lm, extra={"task": "generation", "decoding": decoding, "imported": imported},
                    options=options)
        write_card_from_files(folder)
    if others := named_adapters(adapter_dir):  # PEFT's default adapter at the top, named ones below it
        log(f"note: {adapter_dir} also holds {_in_subfolders(others)}; this imported the one at its top "
            f"(PEFT's 'default'). Import another with {_adapter_flag(adapter_dir, others)}")
    log(f"imported a PEFT prefix-tuning adapter ({prefix.shape[3]} virtual tokens, {n} layers) for {name} into "
        f"{output}; generate / eval / serve read it. Prompts are encoded as frozentune's prefix runs encode them "
        f"(source, then the tokenizer's bos as separator)")
    return {"format": "peft", "output": str(output), "backbone": name, "num_virtual_tokens": int(prefix.shape[3]),
            "num_layers": n, "kv_heads": h, "head_dim": k // h}
