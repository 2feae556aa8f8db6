"""Prefix-tuning of a frozen encoder-decoder LM (BART, T5; Li & Liang 2021 §4, summarisation):
z = [PREFIX; x] into the encoder and [PREFIX'; y] into the decoder, with separately parameterised
prefixes for the encoder's self-attention, the decoder's self-attention and the decoder's
cross-attention (the paper's code trains three: `wte_enc`/`control_trans_enc`, `wte`/
`control_trans`, `wte2`/`control_trans2`). Each kind is a prefix.PrefixEncoder of its own (MLP
reparameterisation or direct), so saving keeps only the three materialised tensors.

Also the reference method on the same path: the encoder-decoder LM fine-tuned (all or its top
layers) with no prefix.

Legend: B rows, N layers of one kind, H key/value heads, P prefix slots, E head dim, S source
tokens, T target tokens. A prefix of one kind is (N, 2, H, P, E), as for a causal LM.

Training loss: the model's own cross-entropy on the target tokens (labels, shifted right by the
model into decoder inputs from its decoder start token), padding ignored. Decoding: the model's
own `generate` (greedy or beam) with the prefixes set; `greedy_reference` decodes with forward
calls only and no cache, the reference the tests hold `generate` against.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from ...backbone import freeze, heads_of, pad
from ...model import WEIGHTS, write_saved
from ..prefix import (IGNORE, KVShape, LMTuner, PrefixBatch, PrefixConfig, PrefixEncoder, PrefixError, architecture,
                      check_fits, lm_entry, phrase_ids, read_prefix_folder, saved_options, until_eos)
from ..precision import decoding
from .attention import KINDS, Site, find_sites, prefixes_set, site_activations

ARCHITECTURE = "encoder-decoder"
Prefixes = dict[str, Tensor]        # {kind: (N, 2, H, P, E)}
Batch = dict[str, PrefixBatch]      # {kind: one prefix per row}


def is_seq2seq(lm: nn.Module) -> bool:
    return architecture(lm) == ARCHITECTURE


def shapes_of(sites: dict[str, list[Site]]) -> dict[str, KVShape]:
    return {kind: KVShape(len(found), found[0].heads, found[0].head_dim) for kind, found in sites.items()}


def single(prefixes: Prefixes, rows: int) -> Batch:
    """The same prefixes on every row (views: gradients reach them)."""
    return {kind: PrefixBatch.single(p, rows) for kind, p in prefixes.items()}


def mixed(rows: Sequence[Prefixes]) -> Batch:
    """Row b uses rows[b]'s prefixes; lengths may differ between rows (left-padded, masked)."""
    return {kind: PrefixBatch.mixed([r[kind] for r in rows]) for kind in KINDS}


def prefixed(lm: nn.Module, sites: dict[str, list[Site]] | None, batch: Batch | None):
    """The context in which `lm`'s forward and generate see `batch`'s prefixes, moved to the LM's device
    (None: the plain model)."""
    import contextlib

    if batch is None:
        return contextlib.nullcontext()
    assert sites is not None
    device = next(lm.parameters()).device
    return prefixes_set(sites, {k: b.kv.to(device) for k, b in batch.items()},
                        {k: b.mask.to(device) for k, b in batch.items()})


def seq2seq_loss(lm: nn.Module, sites, batch: Batch | None, sources: Sequence[Sequence[int]],
                 targets: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Mean cross-entropy over the target tokens of the batch (all weighted alike)."""
    if len(sources) != len(targets):
        raise PrefixError(f"{len(sources)} sources but {len(targets)} targets")
    for i, (x, y) in enumerate(zip(sources, targets)):
        if not len(x) or not len(y):
            raise PrefixError(f"example {i}: source and target need at least one token each")
    device = next(lm.parameters()).device
    ids, mask = (t.to(device) for t in pad(sources, pad_id))
    labels, _ = pad(targets, IGNORE)
    with prefixed(lm, sites, batch):
        return lm(input_ids=ids, attention_mask=mask, labels=labels.to(device), use_cache=False).loss


@torch.no_grad()
def seq2seq_generate(lm: nn.Module, sites, batch: Batch | None, prompts: Sequence[Sequence[int]], pad_id: int,
                     eos_id: int | None, max_new_tokens: int = 64, num_beams: int = 1, **kwargs) -> list[list[int]]:
    """Greedy or beam search through the model's `generate`, each row after its prefixes; the new
    tokens of each row up to (not including) eos. kwargs go to `generate`."""
    device = next(lm.parameters()).device
    if batch is not None and any(b.batch_size != len(prompts) for b in batch.values()):
        raise PrefixError(f"prefix batch rows differ from the {len(prompts)} prompts")
    ids, mask = (t.to(device) for t in pad(prompts, pad_id))
    with prefixed(lm, sites, batch), decoding(lm):  # decoding: autocast where the LM decodes in bf16/fp16
        out = lm.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, do_sample=False,
                          max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id, **kwargs)
    return [until_eos(row, eos_id) for row in out[:, 1:].tolist()]  # column 0: the decoder start token


@torch.no_grad()
def greedy_reference(lm: nn.Module, sites, batch: Batch | None, prompts: Sequence[Sequence[int]], pad_id: int,
                     eos_id: int | None, max_new_tokens: int = 64) -> list[list[int]]:
    """Greedy decoding by whole forward passes (no cache, no `generate`): slow and plain."""
    device = next(lm.parameters()).device
    ids, mask = (t.to(device) for t in pad(prompts, pad_id))
    start = lm.config.decoder_start_token_id
    dec = torch.full((len(prompts), 1), int(start if start is not None else pad_id), dtype=torch.long, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    with prefixed(lm, sites, batch), decoding(lm):
        for _ in range(max_new_tokens):
            logits = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, use_cache=False).logits
            nxt = logits[:, -1].argmax(-1)                                      # (B,)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            dec = torch.cat([dec, nxt[:, None]], 1)
            if eos_id is not None:
                done |= nxt == eos_id
            if done.all():
                break
    return [until_eos(row, eos_id) for row in dec[:, 1:].tolist()]


# ----------------------------------------------------------------------------- text
def max_source_tokens(lm: nn.Module, tok) -> int | None:
    """The most source tokens the model takes: its position table (BART), or the tokenizer's limit."""
    limits = [v for v in (getattr(lm.config, "max_position_embeddings", None), getattr(tok, "model_max_length", None))
              if isinstance(v, int) and 0 < v < 10**8]
    return min(limits) if limits else None


def encode_texts(tok, texts: Sequence[str], eos_id: int | None, limit: int | None) -> list[list[int]]:
    """Token ids with the tokenizer's own special tokens (BART: <s> … </s>, T5: … </s>), ending in
    eos (added when the tokenizer does not add it), cut to `limit` (keeping the eos)."""
    return encode_cut(tok, texts, eos_id, limit)[0]


def encode_cut(tok, texts: Sequence[str], eos_id: int | None,
               limit: int | None) -> tuple[list[list[int]], list[bool]]:
    """(encode_texts' ids, whether each text was cut: longer than `limit`). A text far longer than the
    limit is tokenized from a leading part with the same first tokens (backbone.heads_of), not whole: a
    server's request of 500,000 characters is not tokenized whole to keep its first 1,024 tokens."""
    texts = list(texts)
    heads = texts if limit is None else heads_of(tok, texts, limit)[0]
    out, cut = [], []
    for text, head, ids in zip(texts, heads, tok(heads, add_special_tokens=True)["input_ids"]):
        ids = list(ids)
        if eos_id is not None and (not ids or ids[-1] != eos_id):
            ids.append(eos_id)
        cut.append(limit is not None and (len(ids) > limit or len(head) < len(text)))
        if limit is not None and len(ids) > limit:
            ids = ids[:limit - 1] + ids[-1:]
        out.append(ids)
    return out, cut


# ----------------------------------------------------------------------------- the methods
class Seq2SeqTuner(LMTuner):
    """An encoder-decoder LM `self.lm` as the trainer and the decoder use it; `prefix_batch` gives
    the prefixes of each row (None: the plain model)."""

    sites: dict[str, list[Site]] | None = None

    def prefix_batch(self, rows: int, train: bool) -> Batch | None:  # type: ignore[override]
        return None

    def source_limit(self) -> int | None:
        """The most source tokens the encoder takes (None: no limit known)."""
        return max_source_tokens(self.lm, self.tok)

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids, cut to `source_limit`."""
        return self.encode_sources_cut(texts)[0]

    def encode_sources_cut(self, texts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """(encode_sources' ids, whether each source was cut to `source_limit`): the server says which."""
        return encode_cut(self._tok(), texts, self.eos_id(), self.source_limit())

    def sources_cut(self, texts: Sequence[str]) -> tuple[int, int | None]:
        """(how many of `texts` are longer than the model takes, that limit): encode_sources cuts them."""
        limit = self.source_limit()
        if limit is None:
            return 0, None
        return sum(self.encode_sources_cut(texts)[1]), limit

    def targets_too_long(self, texts: Sequence[str]) -> tuple[int, int | None]:
        """(how many of `texts` hold more tokens than the decoder has positions, that limit; None: no
        stated limit). Trained on, such a target fails in the decoder's position table."""
        limit = getattr(self.lm.config, "max_position_embeddings", None)
        if not isinstance(limit, int):
            return 0, None
        return sum(len(ids) > limit for ids in self.encode_targets(texts)), limit

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        if self.eos_id() is None:
            raise PrefixError("the tokenizer has no eos token; generation could not learn to stop")
        return encode_texts(self._tok(), texts, self.eos_id(), None)

    def _tok(self):
        if self.tok is None:
            raise PrefixError("encoding text needs the LM's tokenizer; give tok= when building the tuner")
        return self.tok

    def loss(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> Tensor:
        return seq2seq_loss(self.lm, self.sites, self.prefix_batch(len(sources), True), sources, targets,
                            self.pad_id())

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, num_beams: int = 1,
                 **kwargs) -> list[list[int]]:
        return seq2seq_generate(self.lm, self.sites, self.prefix_batch(len(prompts), False), prompts, self.pad_id(),
                                self.eos_id(), max_new_tokens, num_beams, **kwargs)


class Seq2SeqPrefixTuner(Seq2SeqTuner):
    """A frozen encoder-decoder LM plus three trainable PrefixEncoders (encoder, decoder, cross).
    Only the encoders are submodules: `parameters()` is what is trained, `.to()` moves only them.
    Building one routes the LM's attention through frozentune's prefix attention (attention.py)."""

    def __init__(self, cfg: PrefixConfig, lm: nn.Module, tok=None, lm_name: str = ""):
        super().__init__()
        cfg.validate()
        if not is_seq2seq(lm):
            raise PrefixError(f"{type(lm).__name__} is a decoder-only LM; its prefix is frozentune.generation.prefix.PrefixTuner "
                              f"(--method prefix picks it by the model)")
        freeze(lm)
        self.__dict__["lm"] = lm  # not registered: frozen, never saved
        self.cfg, self.tok, self.lm_name = cfg, tok, lm_name
        self.sites = find_sites(lm)
        self.shapes = shapes_of(self.sites)
        d = int(lm.config.hidden_size)
        self.encoders = nn.ModuleDict({kind: PrefixEncoder(cfg, shape, d) for kind, shape in self.shapes.items()})
        if cfg.init == "words":
            if tok is None:
                raise PrefixError("init=words needs the LM's tokenizer to read init_text")
            acts = site_activations(lm, self.sites, phrase_ids(tok, cfg.init_text, cfg.prefix_length))
            for kind, encoder in self.encoders.items():
                encoder.init_from(acts[kind])

    def prefixes(self, train: bool = False) -> Prefixes:
        """{kind: (N, 2, H, P, E)}; differentiable with `train`."""
        return {k: (e() if train else e.materialize()) for k, e in self.encoders.items()}

    def prefix_batch(self, rows: int, train: bool) -> Batch:  # type: ignore[override]
        return single(self.prefixes(train), rows)

    def trainable_state(self) -> dict[str, Tensor]:
        return {f"prefix.{k}": p for k, p in self.prefixes().items()}

    def save(self, folder: Path, extra: dict | None = None) -> None:
        config = {"method": "prefix", "task": "generation", "architecture": ARCHITECTURE,
                  "options": dataclasses.asdict(self.cfg),
                  "backbone": lm_entry(self.lm_name, self.lm),
                  "prefix": {k: {"layers": s.layers, "kv_heads": s.heads, "head_dim": s.head_dim,
                                 "length": self.cfg.prefix_length} for k, s in self.shapes.items()},
                  **(extra or {})}
        write_saved(folder, {k: v.float() for k, v in self.trainable_state().items()}, config)

    @classmethod
    def load(cls, folder: Path, lm: nn.Module, tok=None, lm_name: str = "") -> "Seq2SeqPrefixTuner":
        prefixes, cfg, _ = load_seq2seq_prefix(folder, lm)
        tuner = cls(dataclasses.replace(cfg, reparam=False, init="random"), lm, tok, lm_name)
        for kind, encoder in tuner.encoders.items():
            encoder.init_from(prefixes[kind])
        return tuner


def load_seq2seq_prefix(folder: Path, lm: nn.Module | None = None) -> tuple[Prefixes, PrefixConfig, dict]:
    """({kind: (N, 2, H, P, E)}, options, config.json) of a saved encoder-decoder prefix; with `lm`,
    it must fit the LM's attention and the weights it was trained on."""
    folder = Path(folder)
    config, state = read_prefix_folder(folder, ARCHITECTURE)
    want = {f"prefix.{k}" for k in KINDS}
    if set(state) != want:
        raise PrefixError(f"{folder / WEIGHTS}: expected tensors {sorted(want)}, found {sorted(state)}")
    prefixes = {k: state[f"prefix.{k}"] for k in KINDS}
    for kind, s in config["prefix"].items():
        if tuple(prefixes[kind].shape) != (s["layers"], 2, s["kv_heads"], s["length"], s["head_dim"]):
            raise PrefixError(f"{folder}: {kind} prefix {tuple(prefixes[kind].shape)} does not match config.json {s}")
    if lm is not None:
        if not is_seq2seq(lm):
            raise PrefixError(f"{folder}: a prefix for an encoder-decoder LM cannot be loaded on the decoder-only "
                              f"{type(lm).__name__}; load the model it was trained on "
                              f"({config['backbone'].get('name') or 'not recorded'})")
        shapes = shapes_of(find_sites(lm))
        check_fits(folder, config, lm, {f"{k} prefix": (shapes[k], (p.shape[0], p.shape[2], p.shape[4]))
                                        for k, p in prefixes.items()})
    return prefixes, saved_options(config), config


def saved_numel(prefix_length: int, shapes: dict[str, KVShape]) -> int:
    """Numbers saved: P·2·(N_enc·K_enc + N_dec·K_dec + N_cross·K_cross)."""
    return sum(s.numel(prefix_length) for s in shapes.values())


def shapes_from_config(config) -> dict[str, KVShape]:
    """The three prefix shapes from a BART/T5-like config alone (no weights), e.g. BART-base's."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    e = getattr(config, "d_kv", None) or config.hidden_size // config.num_attention_heads
    enc = getattr(config, "encoder_layers", None) or config.num_layers
    dec = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None) or enc
    dec_heads = getattr(config, "decoder_attention_heads", None) or heads
    enc_heads = getattr(config, "encoder_attention_heads", None) or heads
    return {"encoder": KVShape(enc, enc_heads, e), "decoder": KVShape(dec, dec_heads, e),
            "cross": KVShape(dec, dec_heads, e)}


def _finetuner_base() -> type:
    from ..run import LMFinetuner
    return LMFinetuner


class Seq2SeqFinetuner(Seq2SeqTuner, _finetuner_base()):  # type: ignore[misc]
    """The reference method on an encoder-decoder LM: the model itself trained (all of it, or its
    top k layers of encoder and decoder), through the same loss and decoding as its prefix (none)."""

    def __init__(self, cfg, lm: nn.Module, tok=None, lm_name: str = ""):
        if not is_seq2seq(lm):
            raise PrefixError(f"{type(lm).__name__} is a decoder-only LM; fine-tune it with the causal LMFinetuner "
                              f"(--method finetune picks it by the model)")
        super().__init__(cfg, lm, tok, lm_name)
