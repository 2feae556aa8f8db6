"""A classifier = a registered head + the backbone it reads, and its save/load.

Where batches come from:
  CachedSource  rows of a FeatureCache entry → Features (the backbone is never run)
  LiveSource    token ids → the backbone is run in the forward pass (finetune, or prediction)

Saved folder: model.safetensors (only the trained weights: the head, plus the backbone when it
was trained) and config.json (method, options, backbone id/layers/max_length/weights hash,
label names, training config).

Legend: B batch, T tokens, D hidden, C classes.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from .errors import FrozentuneError
from .backbone import Backbone, LayerSpec, Tokenized, pad, trainable_names
from .cache import CachedStates
from .head import Features, Head, Output
from .pairs import separator_mask
from .registry import MethodConfig, MethodError, create_method, get_method, make_config

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


@dataclass
class Batch:
    """Either cached states or token ids to run through the backbone; for sentence pairs, also
    where the separator between the two texts is (and the token types, to run the backbone)."""
    mask: Tensor                          # (B, T) bool
    hidden: Tensor | None = None          # (B, T, D) float32
    input_ids: Tensor | None = None       # (B, T) int64
    token_type_ids: Tensor | None = None  # (B, T) int64, pairs of a tokenizer that has them
    separator: Tensor | None = None       # (B, T) bool, pairs: the tokens between the two texts

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(None if t is None else t.to(device) for t in
                       (self.mask, self.hidden, self.input_ids, self.token_type_ids, self.separator)))


class Source(Protocol):
    lengths: np.ndarray  # (N,) tokens per example, for length bucketing

    def __len__(self) -> int: ...
    def batch(self, idx: np.ndarray) -> Batch: ...


class CachedSource:
    """Examples `rows` of a cache entry. `sep`: for sentence pairs, the tokenizer's separator ids
    (pairs.separator_ids), found again in the cached token ids to mark where one text ends."""

    def __init__(self, cache: CachedStates, rows: np.ndarray, sep: tuple[int, ...] | None = None):
        self.cache, self.rows, self.sep = cache, np.asarray(rows, dtype=np.int64), sep
        self.lengths = cache.lengths[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, idx: np.ndarray) -> Batch:
        hidden, mask = self.cache.batch(self.rows[idx])
        if self.sep is None:
            return Batch(mask=mask, hidden=hidden)
        ids, _ = pad([self.cache.token_ids(int(r)) for r in self.rows[idx]], 0, mask.shape[1])
        return Batch(mask=mask, hidden=hidden, separator=separator_mask(ids, mask, self.sep))


class LiveSource:
    """Token ids; the model runs the backbone on them. `sep` as for CachedSource."""

    def __init__(self, tokens: Tokenized, pad_id: int, sep: tuple[int, ...] | None = None):
        self.tokens, self.pad_id, self.sep = tokens, pad_id, sep
        self.lengths = tokens.lengths

    def __len__(self) -> int:
        return len(self.tokens.ids)

    def batch(self, idx: np.ndarray) -> Batch:
        ids, mask, types = self.tokens.padded(idx, self.pad_id)
        sep = None if self.sep is None else separator_mask(ids, mask.bool(), self.sep)
        return Batch(mask=mask.bool(), input_ids=ids, token_type_ids=types, separator=sep)


def as_cached(hidden: Tensor, cache_dtype: str) -> Tensor:
    """(B, T, D) states rounded as the feature cache stores them (cache_dtype), back in float32."""
    return hidden.float().to(getattr(torch, cache_dtype)).float()


class Classifier(nn.Module):
    """head(backbone states). The backbone is a registered submodule only when it is trained,
    so `trainable_state` and the optimiser see exactly what is trained."""

    def __init__(self, method: str, cfg: MethodConfig, head: Head, backbone: Backbone,
                 labels: list[str], cache_dtype: str = "float16"):
        super().__init__()
        self.method, self.cfg, self.head = method, cfg, head
        self.backbone_ref = backbone
        self.labels = list(labels)
        self.cache_dtype = cache_dtype
        # (text field, pair field or None) it was trained on: predict refuses the other kind of input.
        # None: not known (built directly, not by `train` or `load`)
        self.pair_fields: tuple[str, str | None] | None = None
        self.base_weights_hash = backbone.weights_hash  # before any training touches it
        # the logits are divided by it (calibrated): 1 until api.train fits one on validation (--calibrate); saved
        # with the weights where it is not 1, under TEMPERATURE. A Python number, so applying it syncs no device
        self.temperature = 1.0
        if cfg.train_backbone:
            self.backbone = backbone.model
            unfreeze_used(backbone, getattr(cfg, "top_layers", 0))

    @property
    def takes_pairs(self) -> bool | None:
        """Whether it was trained on sentence pairs; None when not known (see pair_fields)."""
        return None if self.pair_fields is None else self.pair_fields[1] is not None

    @property
    def trains_backbone(self) -> bool:
        return bool(self.cfg.train_backbone)

    @property
    def steers_backbone(self) -> bool:
        """The head changes what the frozen backbone computes (prefix-tuning): run live, never cached."""
        return bool(getattr(self.head, "steers_backbone", False))

    @property
    def runs_live(self) -> bool:
        return self.trains_backbone or self.steers_backbone

    def features(self, b: Batch) -> Features:
        if b.hidden is not None:
            if self.steers_backbone:
                raise ValueError(f"method {self.method!r} runs the backbone with its prefix; give token ids, not cached states")
            return Features(b.hidden, b.mask, b.separator, self.backbone_ref.precision)
        assert b.input_ids is not None
        types = b.token_type_ids
        if self.steers_backbone:
            hidden = self.head.encode(self.backbone_ref, b.input_ids, b.mask.long(), types)  # type: ignore[operator]
        elif self.trains_backbone:
            hidden = self.backbone_ref.encode(b.input_ids, b.mask.long(), types)
        else:
            hidden = self.backbone_ref.states(b.input_ids, b.mask.long(), types)  # its device and precision
            hidden = as_cached(hidden, self.cache_dtype)  # so live predictions equal cached ones
        return Features(hidden, b.mask, b.separator, "fp32" if self.runs_live else self.backbone_ref.precision)

    def forward(self, b: Batch) -> Output:
        return self.calibrated(self.head(self.features(b)))

    def calibrated(self, out: Output) -> Output:
        """The head's output divided by the fitted temperature (`divided`). Every path that runs the head applies
        it: this forward, the server's shared pass, the ONNX graph (which calls `divided` itself)."""
        return divided(out, self.temperature, getattr(self.head, "logit_parts", ()))

    def trainable_state(self) -> dict[str, Tensor]:
        """What gets saved: the head's state, plus the backbone parameters that were trained, and the temperature
        where one was fitted."""
        head = self.head.saved_state() if hasattr(self.head, "saved_state") else self.head.state_dict()
        state = {f"head.{k}": v for k, v in head.items()}
        if self.trains_backbone:
            state |= {f"backbone.{k}": p for k, p in self.backbone.named_parameters() if p.requires_grad}
        if self.temperature != 1.0:
            state[TEMPERATURE] = torch.tensor(self.temperature, dtype=torch.float64)
        return state

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def divided(out: Output, temperature: float, parts: tuple[str, ...] = ()) -> Output:
    """`out` with its logits divided by a temperature, and the extras that are parts of them (Head.logit_parts)
    too; the same object where the temperature is 1."""
    if temperature == 1.0:
        return out
    return Output(out.logits / temperature,
                  {k: v / temperature if k in parts else v for k, v in out.extras.items()})


def unfreeze_used(backbone: Backbone, top_layers: int = 0) -> None:
    """Make trainable exactly the backbone parameters the chosen layers depend on (not, e.g.,
    BERT's pooler or layers above the one read), found with one backward pass on 2 tokens;
    with top_layers = k, only those of the top k layers."""
    model = backbone.model
    for p in model.parameters():
        p.requires_grad_(True)
        p.grad = None
    ids = torch.full((1, 2), backbone.pad_id(), dtype=torch.long)
    backbone.encode(ids, torch.ones_like(ids)).sum().backward()
    top = set(trainable_names(model, top_layers))
    for n, p in model.named_parameters():
        if p.grad is None or n not in top:
            p.requires_grad_(False)
        p.grad = None


def build_classifier(method: str, backbone: Backbone, labels: list[str],
                     options: dict[str, Any] | None = None, seed: int = 0,
                     cache_dtype: str = "float16") -> Classifier:
    own = get_method(method).encoder is not None
    if backbone.encoder_of != (method if own else None):
        raise MethodError(
            f"method {method!r} trains an encoder of its own: build it with get_method({method!r}).encoder(config, "
            f"max_length) (api.train does), not from the backbone {backbone.name!r}" if own else
            f"{backbone.name!r} is the encoder of method {backbone.encoder_of!r}; use it with that method")
    from .rng import own_rng

    with own_rng(seed):  # the head's initial weights: seeded, and the caller's random state left as it was
        head, cfg = create_method(method, backbone.dim, len(labels), options)
        if hasattr(head, "init_from_backbone"):  # e.g. label embeddings from the backbone's vocabulary
            head.init_from_backbone(backbone, list(labels))
    return Classifier(method, cfg, head, backbone, labels, cache_dtype)


def save_tensors(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, with its I/O errors raised as the OSError they are, naming the file (it
    raised SafetensorError("... No space left on device (os error 28)"), printed as a traceback), and
    the file's mode set by the umask as any other file's (safetensors writes 0600)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        if (code := re.search(r"os error (\d+)", str(e))) is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from e
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


TEMPERATURE = "temperature"  # the weights' entry of a fitted temperature (Classifier.temperature), a float64 scalar
TRAINED_AS = "frozentune_trained_as"  # the weights' metadata entry: `trained_as` of the config they were saved with
BACKBONE_DEFINES = ("layers", "combine", "token_types", "weights_hash", "config_hash", "trained")


def trained_as(config: dict) -> dict:
    """The entries of a saved model's config.json that its weights answer by: the method and its options, the
    labels in their order, whether it reads pairs, which states it reads (layers, their combination, token types,
    the backbone's weights and config, whether the backbone was trained) and, for a generator, its task, kind of
    LM and prefix shape. An edit of one of them loaded without a word and answered wrongly (another pooling, labels
    in another order; bench/fuzz.py's model part sees it with the check off); they are recorded in the weights
    (TRAINED_AS) and compared at load (check_trained_as). The rest may change: names and paths, max_length,
    precision, decoding options, the training record."""
    b = config.get("backbone") if isinstance(config.get("backbone"), dict) else {}
    out = {"method": config.get("method"), "options": config.get("options"), "labels": config.get("labels"),
           "pairs": config.get("text_pair_field") is not None,
           "backbone": {k: b.get(k) for k in BACKBONE_DEFINES if k in b}}
    return out | {k: config[k] for k in ("task", "architecture", "prefix") if k in config}


def write_saved(folder: Path, state: dict[str, Tensor], config: dict) -> None:
    """A saved model folder: folder/model.safetensors (the tensors, contiguous on the CPU) and
    folder/config.json (`config` after the format tag; config["method"] also tags the weights, and the entries
    they answer by are recorded with them: trained_as)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors({k: v.detach().cpu().contiguous() for k, v in state.items()}, folder / WEIGHTS,
                 metadata={"method": config["method"], TRAINED_AS: json.dumps(trained_as(config), sort_keys=True)})
    config = {"format": "frozentune/1", **config, "weights_file": file_checksum(folder / WEIGHTS)}
    (folder / CONFIG).write_text(json.dumps(config, indent=2, allow_nan=False))


def file_checksum(path: Path | bytes) -> dict:
    """{"bytes", "blake2b"} of a file (read in 1 MiB blocks), or of its bytes as read."""
    from .cache import blake2b_of

    if isinstance(path, bytes):
        return {"bytes": len(path), "blake2b": blake2b_of(io.BytesIO(path))}
    with open(path, "rb") as f:
        digest = blake2b_of(f)
    return {"bytes": Path(path).stat().st_size, "blake2b": digest}


def read_config_json(folder: Path, error: type[Exception] | None = None) -> object:
    """folder/config.json parsed, or `error` (default ModelLoadError) saying why it cannot be read."""
    error = error or ModelLoadError
    try:
        return json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"{Path(folder) / CONFIG}: cannot be read ({e.strerror or e}); check its permissions") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{Path(folder) / CONFIG}: not valid JSON ({e}); the folder is damaged: train it again") from None


def read_saved(folder: Path, kind: str = "a folder written by `frozentune train --output`") -> dict:
    """A saved model folder's config.json, after checking that model.safetensors is there, whole
    and the file the config was written with (size and checksum recorded at save time)."""
    folder = Path(folder)
    if folder.is_file():
        raise ModelLoadError(f"{folder}: a file, not a model folder; give {kind}")
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: no such folder; give {kind}")
    if (folder / "sweep.json").is_file() and not (folder / CONFIG).is_file():
        raise ModelLoadError(f"{folder}: the folder of a sweep; its best point's model is {folder / 'best'}")
    if (folder / "onnx.json").is_file() and not (folder / CONFIG).is_file():
        raise ModelLoadError(f"{folder}: an ONNX export, not a saved model folder; `frozentune predict --onnx "
                             f"{folder}` runs it, and the other commands take the model folders it was exported from "
                             f"(export them again after changing one)")
    if (folder / "adapter_config.json").is_file() and not (folder / CONFIG).is_file():
        raise ModelLoadError(f"{folder}: a PEFT adapter, not a frozentune model; bring a prefix-tuning adapter in with "
                             f"`frozentune import --format peft --adapter {folder} --output DIR`")
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise ModelLoadError(f"{folder}: no {name}; is this {kind}?")
    config = read_config_json(folder)
    if not isinstance(config, dict) or "method" not in config:
        raise ModelLoadError(f"{folder / CONFIG}: not a frozentune model config (no 'method'); give {kind}")
    want = config.get("weights_file")
    if "weights_file" not in config:  # saved before 2026-11-23: its weights load as they did then, said once
        print(f"frozentune: note: {folder}: saved by a frozentune that did not record the checksum of {WEIGHTS}, so "
              f"the file is loaded unverified (safetensors: shapes and names are still checked); train it again to "
              f"get a folder whose weights can be verified", file=sys.stderr, flush=True)
        return config
    if not (isinstance(want, dict) and type(want.get("bytes")) is int and isinstance(want.get("blake2b"), str)):
        raise ModelLoadError(f"{folder / CONFIG}: its checksum of {WEIGHTS} ('weights_file') is not what frozentune "
                             f"writes; the folder is damaged: restore it or train again")
    try:
        got = file_checksum(folder / WEIGHTS)
    except OSError as e:
        raise ModelLoadError(f"{folder / WEIGHTS}: cannot be read ({e.strerror or e}); check its permissions") from None
    if got != want:
        what = (f"{got['bytes']:,} bytes, {want['bytes']:,} when saved" if got["bytes"] != want["bytes"]
                else "same size, different content")
        raise ModelLoadError(f"{folder / WEIGHTS}: not the weights this model was saved with ({what}: checksum "
                             f"mismatch); the file was changed or damaged: restore it or train again")
    return config


def read_safetensors(path: Path, error: type[Exception] | None = None,
                     then: str = "the folder is damaged: train it again", device: str = "cpu",
                     data: bytes | None = None) -> dict[str, Tensor]:
    """The tensors of a safetensors file (no code can run), or `error` (default ModelLoadError) in
    one line naming the file and saying `then` what to do; the one reader of every saved folder.
    `data`: the file's bytes, already read (and checked) by the caller."""
    from safetensors import SafetensorError
    from safetensors.torch import load, load_file

    try:
        if data is not None:
            return {k: v.to(device) for k, v in load(data).items()}
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:  # a folder named in bytes that are not UTF-8: safetensors takes no such path
            return {k: v.to(device) for k, v in load(Path(path).read_bytes()).items()}
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as e:  # e.g. a pickle in its place: refused, never run
        raise (error or ModelLoadError)(f"{path}: not a readable safetensors file ({' '.join(str(e).split())}); "
                                        f"{then}") from None


def load_weights(folder: Path, config: dict | None = None) -> dict[str, Tensor]:
    """The tensors of folder/model.safetensors, or ModelLoadError. With `config`, the folder's config.json as
    read_saved read it (seconds earlier: a backbone loaded in between), the bytes parsed are checked to be the
    ones its checksum names, so that a folder another run replaced meanwhile (`train --overwrite`) is said,
    not read half old, half new (its labels with the new weights: wrong answers, exit 0); and the entries of
    config.json the weights answer by are the ones they were saved with (check_trained_as)."""
    path = Path(folder) / WEIGHTS
    if config is None:
        return read_safetensors(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot be read ({e.strerror or e}); check its permissions") from None
    # saved before the checksum was kept: not checked (the entries the weights answer by are, where they hold them)
    if isinstance(config.get("weights_file"), dict) and file_checksum(data) != config["weights_file"]:
        check_unchanged(folder, config)
        raise ModelLoadError(f"{path}: not the weights this model was saved with (checksum mismatch); the file was "
                             f"changed or damaged: restore it or train again")
    state = read_safetensors(path, data=data)
    check_trained_as(folder, config, data)
    return state


def json_differences(now: object, then: object, where: str = "") -> Iterator[tuple[str, object, object]]:
    """(entry, value now, value then) of every leaf where two JSON values differ, dicts entry by entry."""
    if isinstance(now, dict) and isinstance(then, dict):
        for k in sorted(set(now) | set(then)):
            yield from json_differences(now.get(k), then.get(k), f"{where}.{k}" if where else k)
    elif now != then:
        yield where, now, then


def check_trained_as(folder: Path, config: dict, data: bytes) -> None:
    """A ModelLoadError naming the first entry of config.json that its weights answer by (trained_as) and that
    differs from what they were saved with: config.json was edited since. Weights saved before this was recorded
    (2026-11-29): not checked."""
    n = int.from_bytes(data[:8], "little")  # safetensors: an 8-byte header size, then the header (JSON)
    try:
        saved = json.loads(json.loads(data[8:8 + n]).get("__metadata__", {}).get(TRAINED_AS, "null"))
    except (ValueError, AttributeError):
        saved = None
    if not isinstance(saved, dict):
        return
    now = json.loads(json.dumps(trained_as(config), sort_keys=True))  # as it was stored: tuples as lists
    for where, have, had in json_differences(now, saved):
        shown = [json.dumps(v, ensure_ascii=False) for v in (have, had)]
        raise ModelLoadError(f"{Path(folder) / CONFIG}: {where} is {shown[0][:80]}, but {WEIGHTS} was trained with "
                             f"{shown[1][:80]}; config.json was edited since, and these weights answer only as "
                             f"trained: restore that entry, or train the model again")


def check_unchanged(folder: Path, config: dict) -> None:
    """ModelLoadError unless folder/config.json still reads as `config` (read earlier in this load):
    a folder another run replaced meanwhile (`train --overwrite`) is said, not used half old, half new."""
    try:
        same = json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8")) == config
    except (OSError, ValueError):
        same = False
    if not same:
        raise ModelLoadError(f"{folder}: was replaced while it was being loaded (another run saved a model into it); "
                             f"run the command again")


def known_method(config: dict, folder: Path):
    """The registered method a saved config names, or a ModelLoadError naming the folder."""
    try:
        return get_method(config["method"])
    except MethodError as e:
        raise ModelLoadError(f"{Path(folder) / CONFIG}: names a method this frozentune does not have ({e})") from None


def save(model: Classifier, folder: Path, extra: dict | None = None) -> None:
    """Write the trained weights (safetensors) and config.json into folder."""
    bb = model.backbone_ref
    config = {
        "method": model.method,
        "options": dataclasses.asdict(model.cfg),
        "backbone": {"name": bb.name, "layers": list(bb.layers.layers), "combine": bb.layers.combine,
                     "max_length": bb.max_length, "weights_hash": model.base_weights_hash,
                     "config_hash": bb.config_hash, "trained": model.trains_backbone,
                     "cache_dtype": model.cache_dtype, "precision": bb.precision,
                     "token_types": bb.token_types},
        "labels": model.labels,
        **(extra or {}),
    }
    write_saved(folder, model.trainable_state(), config)


class ModelLoadError(FrozentuneError, RuntimeError):
    """A saved model folder is missing, incomplete or does not match its backbone."""


def relative_name(folder: Path, name: str, then: str, what: str = "backbone", reason: str | None = None) -> str | None:
    """Where a saved model's backbone (or LM) name `name` came from, where it is relative and no folder from
    here (a frozentune before 2026-11-27 saved a folder as typed, relative to where training ran), then `then`
    (what to do); `reason`: why it is no Hugging Face model either, where known. None for an alias, an
    absolute path or a folder here."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from .backbone import ALIASES, LM_ALIASES

    local = Path(name).expanduser()
    if name in ALIASES or name in LM_ALIASES or local.is_absolute() or local.is_dir():
        return None
    config, here = Path(folder) / CONFIG, os.getcwd()
    said = "a frozentune before 2026-11-27 saved a folder's path as typed, relative to where training ran"
    try:
        validate_repo_id(name)
    except HFValidationError:  # a path, never a hub id
        return (f"{config} names its {what} by the relative path {name!r}, which is no folder from here ({here}): "
                f"{said}. {then}")
    return (f"{config} names its {what} {name!r}, which is no folder from here ({here}); if it is a folder, {said}. "
            f"{then}" + (f". As a Hugging Face id: {reason}" if reason else ""))


_Loaded = TypeVar("_Loaded")


def load_named(folder: Path, name: str, load: Callable[[str], _Loaded], what: str = "backbone") -> _Loaded:
    """load(name) of the backbone (or LM) a saved model's config.json names; where it is not found and the name
    is relative (relative_name), a ModelLoadError saying where the name comes from and what to do."""
    from .backbone import BackboneError, NotFound

    try:
        return load(name)
    except BackboneError as e:
        reason = (f"{e.reason}; `hf download {name}` where there is network gets it"
                  if isinstance(e, NotFound) and e.reason else " ".join(str(e).split())[:300])
        why = relative_name(folder, name, f"Run from the folder training ran in, or set backbone.name in "
                            f"{Path(folder) / CONFIG} to that folder's absolute path", what, reason)
        if why is None:
            raise
        raise ModelLoadError(why) from None


def check_config_hash(folder: Path, saved: dict, model: nn.Module, what: str = "backbone") -> None:
    """A ModelLoadError where `model`'s config.json differs from the one a saved model's backbone (or LM) had
    (`saved`: its config.json's "backbone", whose config_hash is backbone.config_hash's): the same weights read
    with another head count or rope theta give other states. A model saved before it was recorded: not checked."""
    from .backbone import config_hash, decoding_ids

    if saved.get("config_hash") not in (None, config_hash(model)):
        raise ModelLoadError(f"{folder}: the {what} {saved.get('name')!r} found here has the same weights but another "
                             f"config.json (a field that changes its states: head count, activation, norm epsilon, "
                             f"…) than the one this model was trained on; load the same model files.")
    want = saved.get("decoding_ids")  # a generator's LM, saved since 2026-11-28
    if isinstance(want, dict) and want != (have := decoding_ids(model)):
        changed = ", ".join(f"{k} {want.get(k)} → {have.get(k)}" for k in sorted(set(want) | set(have))
                            if want.get(k) != have.get(k))
        raise ModelLoadError(f"{folder}: the {what} {saved.get('name')!r} found here starts, pads or ends its outputs "
                             f"with other token ids than the one this model was trained on ({changed}); load the "
                             f"same model files, or restore those ids in its config.json / generation_config.json.")


def edited_entry(path: Path, where: str, what: str, value: object) -> ModelLoadError:
    """The error for entry `where` of a saved config.json (`path`) holding `value`, which is not `what`."""
    shown = "missing (or null)" if value is None else json.dumps(value, ensure_ascii=False)
    return ModelLoadError(f"{path}: {where} is {shown[:60]}{'...' if len(shown) > 60 else ''}, not {what}; the file "
                          f"was edited or damaged: restore it, or train the model again")


def check_config(config: dict, path: Path) -> None:
    """A ModelLoadError naming the first entry of a classifier's config.json (read from `path`) that
    cannot be what frozentune wrote there: a hand edit that would otherwise end in a traceback, or
    worse, load and answer wrongly (labels given as one string, two labels of one name)."""
    from .cache import DTYPES
    from .extract.precision import PRECISIONS

    def bad(where: str, what: str, value: object) -> ModelLoadError:
        return edited_entry(path, where, what, value)

    labels = config.get("labels")
    if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) and x for x in labels):
        raise bad('"labels"', "a list of at least two label names", labels)
    if len(set(labels)) != len(labels):
        raise bad('"labels"', "a list of distinct names", labels)
    if not isinstance(config.get("options"), dict):
        raise bad('"options"', "an object of the method's options", config.get("options"))
    for key, may_be_null in (("text_field", False), ("text_pair_field", True)):  # which inputs the model takes
        if key in config and not (isinstance(config[key], str) and config[key] or may_be_null and config[key] is None):
            raise bad(f'"{key}"', "the name of a text field" + (" (or null: single texts)" if may_be_null else ""),
                      config[key])
    train = config.get("train", {})
    if not isinstance(train, dict):
        raise bad('"train"', "an object of the training options", train)
    if not (type(seed := train.get("seed", 0)) is int and 0 <= seed < 2 ** 32):
        raise bad('"train"."seed"', "a whole number from 0 to 2^32 - 1", seed)
    b = config.get("backbone")
    if not isinstance(b, dict):
        raise bad('"backbone"', "an object describing the backbone", b)
    checks = [("name", lambda v: isinstance(v, str) and v != "", "a model id or folder"),
              ("layers", lambda v: isinstance(v, list) and v and all(type(x) is int for x in v), "a list of layer numbers"),
              ("combine", lambda v: isinstance(v, str) and v in ("mean", "concat"), '"mean" or "concat"'),
              ("max_length", lambda v: type(v) is int and v >= 2, "a whole number of tokens, 2 or more")]
    optional = [("precision", lambda v: isinstance(v, str) and v in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
                ("cache_dtype", lambda v: isinstance(v, str) and v in DTYPES, f"one of {', '.join(DTYPES)}"),
                ("token_types", lambda v: isinstance(v, bool), "true or false"),
                ("trained", lambda v: isinstance(v, bool), "true or false")]
    for key, ok, what in checks + [c for c in optional if c[0] in b]:
        if not ok(b.get(key)):
            raise bad(f'"backbone"."{key}"', what, b.get(key))
    if "weights_hash" not in b:  # compared with the backbone found: a KeyError where it was removed
        raise bad('"backbone"."weights_hash"', "a hash of the backbone (text)", None)
    for key in ("weights_hash", "config_hash"):  # (null: a method's own encoder has none; config_hash: older folders)
        if not (b.get(key) is None or isinstance(b[key], str)):
            raise bad(f'"backbone"."{key}"', "a hash of the backbone (text)", b[key])


def load(folder: Path, backbone: Backbone | None = None, runtime: Callable[[dict], tuple[str, str]] | None = None,
         ) -> Classifier:
    """Rebuild a saved classifier; the backbone is loaded from its recorded id unless given.
    runtime(saved backbone config) → (device, precision) of the frozen pass (default: the CPU,
    in the precision the model was trained with)."""
    folder = Path(folder)
    config = read_saved(folder)
    if config.get("task") == "generation":
        raise ModelLoadError(f"{folder}: holds a text generator ({config.get('method')} on "
                             f"{config['backbone'].get('name')}); use `frozentune generate --model {folder}`")
    check_config(config, folder / CONFIG)
    b = config["backbone"]
    spec = LayerSpec(tuple(b["layers"]), b["combine"])
    method = known_method(config, folder)
    # a method's own encoder is saved whole: it is rebuilt from the saved options and every weight
    # comes from the file, so the weights it started from (random or --init) are not needed again
    own = method.encoder is not None
    types = b.get("token_types", True)  # saved before --no-token-types existed: the tokenizer's own
    if backbone is None:
        device, precision = runtime(b) if runtime is not None else ("cpu", b.get("precision", "fp32"))
        backbone = (method.encoder(make_config(method.name, config["options"]), b["max_length"], load_init=False)
                    if own else load_named(folder, b["name"], lambda name: Backbone.load(
                        name, spec, b["max_length"], device=device, precision=precision, token_types=types)))
    elif (backbone.layers, backbone.max_length, backbone.token_types) != (spec, b["max_length"], types):
        raise ModelLoadError(f"{folder}: saved for layers {spec} / max_length {b['max_length']} / token types "
                             f"{'on' if types else 'off'}, given {backbone.layers} / "
                             f"{backbone.max_length} / {'on' if backbone.token_types else 'off'}")
    if not own and backbone.weights_hash != b["weights_hash"]:
        raise ModelLoadError(f"{folder}: the backbone {b['name']!r} found here has different weights "
                             f"from the one this model was trained on; load the same model files.")
    if not own:
        check_config_hash(folder, b, backbone.model)
    model = build_classifier(config["method"], backbone, config["labels"], config["options"],
                             cache_dtype=b.get("cache_dtype", "float16"))
    if hasattr(model.head, "prepare_load"):  # e.g. a prefix saved without the MLP that trained it
        model.head.prepare_load()
    state = load_weights(folder, config)
    if not all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()):
        raise ModelLoadError(f"{folder / WEIGHTS}: holds NaN or infinite weights; the model is unusable: train it again")
    temperature = state.pop(TEMPERATURE, None)  # (absent: none was fitted, or saved before 2026-11-29)
    if temperature is not None and not (temperature.dim() == 0 and temperature.is_floating_point()
                                        and float(temperature) > 0):
        raise ModelLoadError(f"{folder / WEIGHTS}: its {TEMPERATURE!r} is not a positive number "
                             f"({list(temperature.shape)}, {temperature.dtype}); the folder is damaged: train it again")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape that differs: e.g. config.json's labels edited to another count
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        raise ModelLoadError(f"{folder / WEIGHTS}: the weights do not fit config.json ({len(config['labels'])} labels, "
                             f"options {config['options']}): {first[:300]}; restore config.json, or train the model "
                             f"again") from None
    trained = model.trainable_state()  # what the file must hold
    missing = [k for k in missing if k in trained or (own and k.startswith("backbone."))]
    if missing or unexpected:
        raise ModelLoadError(f"{folder / WEIGHTS}: weights do not match method {config['method']!r} "
                             f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    model.eval()
    if temperature is not None:
        model.temperature = float(temperature)
    model.saved_config = config  # type: ignore[attr-defined]
    model.pair_fields = (config.get("text_field", "text"), config.get("text_pair_field"))
    return model

