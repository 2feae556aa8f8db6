"""Prefix-tuning (Li & Liang 2021, "Optimizing Continuous Prompts for Generation") for a frozen
Hugging Face causal LM: trainable key/value activations for P prefix positions in every layer,
fed to the LM as a pre-filled `DynamicCache`; training loss on the target tokens only; greedy and
beam search through the model's own `generate`; one batch mixing many prefixes; save / load of the
materialised prefix only.

Legend: B batch (rows), T tokens, P prefix positions (L_p; in a mixed batch the longest one),
N layers, H key-value heads (grouped-query attention: fewer than the query heads), E head dim,
K = H·E key/value width, D model hidden size, M reparameterisation MLP width.

A prefix is one tensor (N, 2, H, P, E): for layer n, `prefix[n, 0]` are its keys and
`prefix[n, 1]` its values, each (H, P, E) — the shape the LM's own cache holds per row.

Positions. A real token is placed as if the prefix were P real tokens in front of it: row b's
token t gets position (real prefix slots of row b) + (real tokens before t), i.e.
`cumsum([prefix mask; token mask]) - 1`. That is the convention Hugging Face `generate` uses for a
2D attention mask over cache + input, the one Li & Liang's GPT-2 code had (past given → positions
start after it), and the one under which a prefix taken from a phrase's activations *is* that
phrase (the tests hold prefix + x against the plain LM on phrase + x). The same `positions` helper
builds them for the training forward, the reference greedy loop and `generate`, which is given
them explicitly (not left to its defaults), so training and decoding cannot drift apart. With
learned (random) prefixes on a RoPE model the choice only shifts every real position by P.

Mixed batches. Rows may use different prefixes of different lengths: each prefix is left-padded
with zeros to the longest, and those slots are False in the prefix mask, which is prepended to the
token mask; rows never see another row's prefix. Every cache is built fresh per call
(`PrefixBatch.cache`), because forward and generate grow it in place; the prefix tensors
themselves are never written to (`DynamicLayer.update` concatenates into new tensors).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..errors import FrozentuneError
from ..backbone import cache_kwargs, config_hash, decoding_ids, freeze, pad, returned_cache, weights_hash
from ..model import CONFIG, WEIGHTS, check_config_hash, write_saved
from ..registry import MethodConfig, changed

PREFIX_KEY = "prefix"           # the one tensor in WEIGHTS: (N, 2, H, P, E)
IGNORE = -100                   # label of tokens that carry no loss (Hugging Face's ignore_index)


class PrefixError(FrozentuneError, ValueError):
    """A prefix that does not fit the model, or an option that cannot work; says what to do."""


# ----------------------------------------------------------------------------- configuration
@dataclass
class PrefixConfig(MethodConfig):
    prefix_length: int = field(default=10, metadata={
        "help": "L_p: prefix positions per layer (trainable keys and values every token attends to)"})
    reparam: bool = field(default=True, metadata={
        "help": "train the prefix as MLP(P') (Li & Liang: direct training is unstable; PEFT ships it off); "
                "the MLP is dropped after training and only its output is saved"})
    reparam_hidden: int = field(default=512, metadata={
        "help": "hidden width of the reparameterisation MLP Linear(d, M) → tanh → Linear(M, layers·2·kv_dim)"})
    init: str = field(default="random", metadata={
        "help": "random, or words: start from the LM's keys/values on init_text (Li & Liang §7.4)",
        "choices": ("random", "words")})
    init_text: str = field(default="table-to-text:", metadata={
        "help": "phrase for init=words; its tokens are repeated / cut to exactly prefix_length"})

    def unused(self) -> list[tuple[list[str], str]]:
        return [(changed(self, "init_text") if self.init != "words" else [],
                 "is the phrase --init words starts from: with --init random it is not used; add --init words, or "
                 "leave it out"),
                (changed(self, "reparam_hidden") if not self.reparam else [],
                 "is the width of the reparameterising MLP: with --no-reparam there is none; leave it out")]

    def validate(self) -> None:
        if self.train_backbone:
            raise ValueError("prefix: the LM stays frozen (that is the method); train_backbone must be false")
        if self.prefix_length < 0:
            raise ValueError(f"prefix: prefix_length={self.prefix_length}; give 0 or more positions")
        if self.reparam_hidden < 1:
            raise ValueError(f"prefix: reparam_hidden={self.reparam_hidden}; give a width of at least 1")
        if self.init == "words":
            if not self.init_text.strip():
                raise ValueError("prefix: init=words needs a phrase in init_text")
            if self.prefix_length < 1:
                raise ValueError("prefix: init=words needs prefix_length ≥ 1")
            if self.reparam and self.prefix_length > self.reparam_hidden:
                raise ValueError(f"prefix: init=words with the MLP fits its output to the phrase exactly only when "
                                 f"prefix_length ({self.prefix_length}) ≤ reparam_hidden ({self.reparam_hidden}); "
                                 f"raise reparam_hidden or set reparam=false")


@dataclass(frozen=True)
class KVShape:
    """What one prefix position holds per layer: H key-value heads of E dims, for N layers."""
    layers: int    # N
    heads: int     # H (the key-value heads: 3 for SmolLM2, whose 9 query heads share them)
    head_dim: int  # E

    @property
    def kv_dim(self) -> int:  # K
        return self.heads * self.head_dim

    def numel(self, length: int) -> int:
        """Numbers in a saved prefix of `length` positions: P·N·2·K."""
        return length * self.layers * 2 * self.kv_dim

    def tensor_shape(self, length: int) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.heads, length, self.head_dim)

    @staticmethod
    def from_config(config: Any) -> "KVShape":
        """From a Hugging Face config (Llama/SmolLM2, GPT-2, … : num_key_value_heads and head_dim
        when present, else every query head has its own key/value head of hidden/heads dims)."""
        if hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        n, heads = config.num_hidden_layers, config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        e = getattr(config, "head_dim", None) or config.hidden_size // heads
        return KVShape(int(n), int(kv), int(e))


def saved_numel(cfg: PrefixConfig, shape: KVShape) -> int:
    """Numbers saved after training (the materialised prefix): P·N·2·K."""
    return shape.numel(cfg.prefix_length)


def trainable_numel(cfg: PrefixConfig, shape: KVShape, d_model: int) -> int:
    """Parameters trained: with the MLP, P·D + (D·M + M) + (M·N·2·K + N·2·K); without, P·N·2·K."""
    if not cfg.reparam:
        return saved_numel(cfg, shape)
    out, m = shape.layers * 2 * shape.kv_dim, cfg.reparam_hidden
    return cfg.prefix_length * d_model + d_model * m + m + m * out + out


# ----------------------------------------------------------------------------- the trainable prefix
class PrefixEncoder(nn.Module):
    """P_θ, the per-layer prefix keys/values. With `reparam`, P_θ = MLP(P'_θ), P'_θ a (P, D)
    table; otherwise P_θ is the parameter itself. forward() → (N, 2, H, P, E)."""

    def __init__(self, cfg: PrefixConfig, shape: KVShape, d_model: int):
        super().__init__()
        self.cfg, self.shape, self.length = cfg, shape, cfg.prefix_length
        if cfg.reparam:
            self.embedding = nn.Parameter(torch.randn(self.length, d_model))  # P'_θ (P, D), N(0, 1) like nn.Embedding
            self.mlp = nn.Sequential(nn.Linear(d_model, cfg.reparam_hidden), nn.Tanh(),
                                     nn.Linear(cfg.reparam_hidden, shape.layers * 2 * shape.kv_dim))
        else:
            self.prefix = nn.Parameter(torch.randn(shape.tensor_shape(self.length)))  # N(0, 1), as PEFT

    def forward(self) -> Tensor:
        if not self.cfg.reparam:
            return self.prefix
        n, h, e = self.shape.layers, self.shape.heads, self.shape.head_dim
        flat = self.mlp(self.embedding)                                  # (P, N·2·K)
        return flat.view(self.length, n, 2, h, e).permute(1, 2, 3, 0, 4)  # (N, 2, H, P, E)

    @torch.no_grad()
    def materialize(self) -> Tensor:
        """The plain prefix (N, 2, H, P, E), detached: what is saved; the MLP is not needed again."""
        return self().detach().clone().contiguous()

    @torch.no_grad()
    def init_from(self, target: Tensor) -> None:
        """Start at `target` (N, 2, H, P, E). Direct: copy it. With the MLP: keep P'_θ and the first
        layer as initialised and solve the last layer in closed form so that MLP(P'_θ) = target
        exactly (minimum-norm least squares on the P tanh features; exact since P ≤ M and random
        features are independent): training then starts from the phrase's activations and keeps
        the reparameterisation's optimisation benefit."""
        if tuple(target.shape) != self.shape.tensor_shape(self.length):
            raise PrefixError(f"init: target shape {tuple(target.shape)}, prefix needs "
                              f"{self.shape.tensor_shape(self.length)}")
        if not self.cfg.reparam:
            self.prefix.copy_(target)
            return
        first, last = self.mlp[0], self.mlp[2]
        feats = torch.tanh(first(self.embedding)).double()                            # (P, M)
        y = target.permute(3, 0, 1, 2, 4).reshape(self.length, -1).double()           # (P, N·2·K)
        bias = y.mean(0)
        weight = torch.linalg.pinv(feats) @ (y - bias)                                # (M, N·2·K)
        last.weight.copy_(weight.T.to(last.weight.dtype))
        last.bias.copy_(bias.to(last.bias.dtype))
        err = (self() - target).abs().max().item()
        if err > 1e-3 * max(1.0, target.abs().max().item()):
            raise PrefixError(f"init: the MLP could not be fitted to the phrase's activations (max error {err:.3g}); "
                              f"set reparam=false for init=words")


def phrase_ids(tok, text: str, length: int) -> list[int]:
    """The phrase's token ids (no special tokens) repeated and cut to exactly `length`: a longer
    phrase keeps its first `length` tokens, a shorter one is repeated (as PEFT's text init of prompt
    tuning does), so the prefix always has the configured length and real positions 0..P-1."""
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise PrefixError(f"init_text {text!r} has no tokens for this tokenizer; give a non-empty phrase")
    return (ids * (length // len(ids) + 1))[:length]


@torch.no_grad()
def activations(model: nn.Module, ids: Sequence[int]) -> Tensor:
    """The LM's own keys/values (N, 2, H, P, E) on the tokens `ids` (P = len(ids)), at positions 0..P-1."""
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=device)
    layers = returned_cache(model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=True)).layers
    return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in layers]).float()


# ----------------------------------------------------------------------------- feeding prefixes to the LM
@dataclass
class PrefixBatch:
    """One prefix per row, ready to become a cache. Rows with a shorter prefix are zero-padded on
    the left of the prefix block and masked out."""
    kv: Tensor    # (N, 2, B, H, P, E)
    mask: Tensor  # (B, P) bool, False on padding slots

    @staticmethod
    def single(prefix: Tensor, batch_size: int) -> "PrefixBatch":
        """The same prefix (N, 2, H, P, E) on every row (a view: gradients reach `prefix`)."""
        n, two, h, p, e = prefix.shape
        kv = prefix.unsqueeze(2).expand(n, two, batch_size, h, p, e)
        return PrefixBatch(kv, torch.ones(batch_size, p, dtype=torch.bool, device=prefix.device))

    @staticmethod
    def mixed(prefixes: Sequence[Tensor]) -> "PrefixBatch":
        """Row b uses prefixes[b] (N, 2, H, P_b, E); lengths may differ (0 allowed)."""
        if not prefixes:
            raise PrefixError("a prefix batch needs at least one row")
        shapes = {(p.shape[0], p.shape[1], p.shape[2], p.shape[4]) for p in prefixes}
        if len(shapes) != 1:
            raise PrefixError(f"prefixes of one batch must be for the same model; got per-layer shapes {sorted(shapes)}")
        longest = max(p.shape[3] for p in prefixes)
        n, two, h, _, e = prefixes[0].shape
        first = prefixes[0]
        kv = first.new_zeros(n, two, len(prefixes), h, longest, e)
        mask = torch.zeros(len(prefixes), longest, dtype=torch.bool, device=first.device)
        for b, p in enumerate(prefixes):
            length = p.shape[3]
            if length:
                kv[:, :, b, :, longest - length:] = p
                mask[b, longest - length:] = True
        return PrefixBatch(kv, mask)

    @property
    def batch_size(self) -> int:
        return self.kv.shape[2]

    def repeat_interleave(self, k: int) -> "PrefixBatch":
        """Each row k times in a row: the layout `generate` gives beams and returned sequences
        (rows b·k … b·k+k-1 come from row b). It does not expand a cache it was given."""
        if k == 1:
            return self
        return PrefixBatch(self.kv.repeat_interleave(k, dim=2), self.mask.repeat_interleave(k, dim=0))

    def cache(self, model: nn.Module):
        """A fresh `DynamicCache` holding the prefix in every layer (the forward / generate call
        grows it in place, so never reuse one). Models whose cache layers are not plain full-attention
        layers (sliding windows, linear attention, shared KV) are refused: they would drop or ignore a prefix."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        from .precision import decode_dtype

        kv = self.kv.to(decode_dtype(model))  # the dtype the layers' own keys and values come in
        cache = DynamicCache([(kv[n, 0], kv[n, 1]) for n in range(kv.shape[0])], config=model.config)
        odd = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
        if odd or len(cache.layers) != kv.shape[0]:
            raise PrefixError(f"{type(model).__name__}: prefix-tuning needs one full-attention cache layer per layer "
                              f"({kv.shape[0]} prefixes, cache has {len(cache.layers)}"
                              f"{', of types ' + ', '.join(sorted(odd)) if odd else ''}); use a Llama/GPT-2-like LM")
        return cache


def positions(mask: Tensor, tokens: int) -> Tensor:
    """Position ids (B, T) of the last `tokens` slots of a (B, P+T) prefix+token mask: real slots
    are counted from 0 across prefix and tokens, padding gets 0 (Hugging Face generate's rule)."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(~mask.bool(), 0)[:, mask.shape[1] - tokens:]


def prefix_forward(model: nn.Module, prefix: PrefixBatch, input_ids: Tensor, attention_mask: Tensor, **kwargs):
    """The LM's forward on input_ids (B, T) (attention_mask (B, T), 1 on real tokens) after the
    prefix; returns the model's output (logits (B, T, V), loss when `labels` is given)."""
    if prefix.batch_size != input_ids.shape[0]:
        raise PrefixError(f"prefix batch has {prefix.batch_size} rows, input has {input_ids.shape[0]}")
    full = torch.cat([prefix.mask, attention_mask.bool()], 1)  # (B, P+T)
    return model(input_ids=input_ids, attention_mask=full.long(), position_ids=positions(full, input_ids.shape[1]),
                 use_cache=True, **cache_kwargs(model, prefix.cache(model)), **kwargs)


def pack_pairs(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
               pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows x ; y right-padded → input_ids (B, T), attention_mask (B, T), labels (B, T) with the
    y tokens as labels and IGNORE on x and padding (the model shifts labels by one itself)."""
    if len(sources) != len(targets):
        raise PrefixError(f"{len(sources)} sources but {len(targets)} targets")
    for i, (x, y) in enumerate(zip(sources, targets)):
        if not len(x) or not len(y):
            raise PrefixError(f"example {i}: source and target need at least one token each "
                              f"(the first target token is predicted from the last source token)")
    ids, mask = pad([list(x) + list(y) for x, y in zip(sources, targets)], pad_id)
    labels = torch.full_like(ids, IGNORE)
    for b, (x, y) in enumerate(zip(sources, targets)):
        labels[b, len(x):len(x) + len(y)] = torch.tensor(list(y), dtype=torch.long)
    return ids, mask, labels


def prefix_lm_loss(model: nn.Module, prefix: PrefixBatch | Tensor, sources: Sequence[Sequence[int]],
                   targets: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Mean cross-entropy over the target tokens of [PREFIX; x; y] (the batch's y tokens, all weighted
    alike). `prefix`: a PrefixBatch, or one prefix (N, 2, H, P, E) for every row."""
    if isinstance(prefix, Tensor):
        prefix = PrefixBatch.single(prefix, len(sources))
    device = prefix.kv.device
    ids, mask, labels = (t.to(device) for t in pack_pairs(sources, targets, pad_id))
    return prefix_forward(model, prefix, ids, mask, labels=labels).loss


def until_eos(row: Sequence[int], eos_id: int | None) -> list[int]:
    """The ids of one generated row before its first eos."""
    row = [int(t) for t in row]
    return row[:row.index(eos_id)] if eos_id is not None and eos_id in row else row


@torch.no_grad()
def generate(model: nn.Module, prefix: PrefixBatch, prompts: Sequence[Sequence[int]], pad_id: int,
             eos_id: int | None, max_new_tokens: int = 64, num_beams: int = 1, **kwargs) -> list[list[int]]:
    """Greedy (num_beams=1) or beam search through `model.generate`, row b after its prefix; returns
    the new tokens of each row up to (not including) eos. The prompts are left-padded; the cache is
    built here for B·num_beams rows, since `generate` expands its inputs per beam but not a cache it
    is given. kwargs go to `generate` (length_penalty, num_return_sequences, …: rows then come
    num_return_sequences per prompt)."""
    from .precision import decoding

    if prefix.batch_size != len(prompts):
        raise PrefixError(f"prefix batch has {prefix.batch_size} rows, {len(prompts)} prompts")
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in pad(prompts, pad_id, left=True))
    prefix = PrefixBatch(prefix.kv.to(device), prefix.mask.to(device))
    full = torch.cat([prefix.mask, mask.bool()], 1)  # (B, P+T)
    expand = max(num_beams, int(kwargs.get("num_return_sequences", 1)))
    with decoding(model):  # autocast where the LM was made to decode in bf16/fp16 (generation/precision.py)
        out = model.generate(input_ids=ids, attention_mask=full.long(), position_ids=positions(full, ids.shape[1]),
                             **cache_kwargs(model, prefix.repeat_interleave(expand).cache(model)),
                             num_beams=num_beams, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=eos_id, **kwargs)
    return [until_eos(row, eos_id) for row in out[:, ids.shape[1]:].tolist()]


@torch.no_grad()
def greedy_reference(model: nn.Module, prefix: PrefixBatch, prompts: Sequence[Sequence[int]], pad_id: int,
                     eos_id: int | None, max_new_tokens: int = 64) -> list[list[int]]:
    """Slow, readable greedy decoding with forward calls only (no `generate`): the reference the
    tests hold `generate` against, so a change in how generate treats a given cache shows up."""
    from .precision import decoding

    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in pad(prompts, pad_id, left=True))
    prefix = PrefixBatch(prefix.kv.to(device), prefix.mask.to(device))
    full = torch.cat([prefix.mask, mask.bool()], 1)                 # (B, P+T)
    cache = prefix.cache(model)
    with decoding(model):  # as generate() decodes
        out = model(input_ids=ids, attention_mask=full.long(), position_ids=positions(full, ids.shape[1]),
                    use_cache=True, **cache_kwargs(model, cache))
        new, done = [], torch.zeros(len(prompts), dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1)                          # (B,)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            new.append(nxt)
            if eos_id is not None:
                done |= nxt == eos_id
            if done.all():
                break
            full = torch.cat([full, torch.ones_like(full[:, :1])], 1)
            out = model(input_ids=nxt[:, None], attention_mask=full.long(), position_ids=positions(full, 1),
                        use_cache=True, **cache_kwargs(model, returned_cache(out)))
    return [until_eos(row, eos_id) for row in torch.stack(new, 1).tolist()]


# ----------------------------------------------------------------------------- text
def separator_id(tok) -> int:
    """The token between source and target (Li & Liang: `x <bos> y <eos>`): bos, else eos."""
    sep = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if sep is None:
        raise PrefixError("the tokenizer has neither a bos nor an eos token; prefix-tuning needs one to "
                          "separate source from target and to stop generation")
    return int(sep)


def encode_sources(tok, sources: Sequence[str]) -> list[list[int]]:
    """x tokens: the linearised table, then the separator."""
    sep = separator_id(tok)
    return [list(ids) + [sep] for ids in tok(list(sources), add_special_tokens=False)["input_ids"]]


def encode_targets(tok, targets: Sequence[str]) -> list[list[int]]:
    """y tokens: ' ' + text (so a byte-level BPE sees a word start), then eos."""
    if tok.eos_token_id is None:
        raise PrefixError("the tokenizer has no eos token; generation could not learn to stop")
    return [list(ids) + [int(tok.eos_token_id)]
            for ids in tok([" " + t for t in targets], add_special_tokens=False)["input_ids"]]


# ----------------------------------------------------------------------------- the method object
class LMTuner(nn.Module):
    """A causal LM `self.lm` adapted by what a subclass trains, as the trainer and the decoder use it:
    the loss on target tokens and decoding, both after the prefix batch the subclass gives
    (`prefix_batch`), so every generation method trains and decodes through the same code."""

    lm: nn.Module
    tok: Any

    def prefix_batch(self, rows: int, train: bool) -> PrefixBatch:
        """The prefix of `rows` rows; with `train`, differentiable."""
        raise NotImplementedError

    def loss(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> Tensor:
        return prefix_lm_loss(self.lm, self.prefix_batch(len(sources), True), sources, targets, self.pad_id())

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, num_beams: int = 1,
                 **kwargs) -> list[list[int]]:
        return generate(self.lm, self.prefix_batch(len(prompts), False), prompts, self.pad_id(), self.eos_id(),
                        max_new_tokens, num_beams, **kwargs)

    def generate_text(self, sources: Sequence[str], max_new_tokens: int = 64, num_beams: int = 1,
                      **kwargs) -> list[str]:
        """Sources (linearised tables) → generated texts, special tokens dropped, in one batch
        (generation.decode batches many by length)."""
        if self.tok is None:
            raise PrefixError("generate_text needs the LM's tokenizer; give tok= when building the tuner")
        rows = self.generate(self.encode_sources(sources), max_new_tokens, num_beams, **kwargs)
        return [self.tok.decode(r, skip_special_tokens=True).strip() for r in rows]

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """Source texts → the token ids `generate` and `loss` take (here: x, then the separator)."""
        return encode_sources(self.tok, texts)

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Target texts → the token ids `loss` scores (here: ' ' + y, then eos)."""
        return encode_targets(self.tok, texts)

    def pad_id(self) -> int:
        return pad_id_of(self.lm, self.tok)

    def eos_id(self) -> int | None:
        return eos_id_of(self.lm, self.tok)

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class PrefixTuner(LMTuner):
    """A frozen causal LM plus a trainable PrefixEncoder. Only the encoder is a submodule, so
    `parameters()` is exactly what is trained and `.to()` moves only it (move the LM yourself)."""

    def __init__(self, cfg: PrefixConfig, lm: nn.Module, tok=None, lm_name: str = ""):
        super().__init__()
        cfg.validate()
        if architecture(lm) == "encoder-decoder":
            raise PrefixError(f"{type(lm).__name__} is an encoder-decoder model; its prefix is "
                              f"frozentune.generation.seq2seq.Seq2SeqPrefixTuner (--method prefix picks it by the model)")
        freeze(lm)
        self.__dict__["lm"] = lm  # not registered: frozen, never saved
        self.cfg, self.tok, self.lm_name = cfg, tok, lm_name
        self.shape = KVShape.from_config(lm.config)
        check_kv_shape(lm, self.shape)
        self.encoder = PrefixEncoder(cfg, self.shape, lm.config.get_text_config(decoder=True).hidden_size)
        if cfg.init == "words":
            if tok is None:
                raise PrefixError("init=words needs the LM's tokenizer to read init_text")
            self.encoder.init_from(activations(lm, phrase_ids(tok, cfg.init_text, cfg.prefix_length)))

    def prefix(self) -> Tensor:
        """(N, 2, H, P, E), differentiable."""
        return self.encoder()

    def prefix_batch(self, rows: int, train: bool) -> PrefixBatch:
        return PrefixBatch.single(self.prefix() if train else self.encoder.materialize(), rows)

    def trainable_state(self) -> dict[str, Tensor]:
        """What gets saved: the materialised prefix only (the MLP and P' are dropped)."""
        return {PREFIX_KEY: self.encoder.materialize()}

    def save(self, folder: Path, extra: dict | None = None) -> None:
        save_prefix(folder, self.encoder.materialize(), self.cfg, self.lm_name, self.lm, extra)

    @classmethod
    def load(cls, folder: Path, lm: nn.Module, tok=None, lm_name: str = "") -> "PrefixTuner":
        """A tuner holding the saved prefix as a direct parameter (the MLP is gone; training can go on)."""
        prefix, cfg, _ = load_prefix(folder, lm)
        tuner = cls(dataclasses.replace(cfg, reparam=False, init="random"), lm, tok, lm_name)
        tuner.encoder.init_from(prefix)
        return tuner


def _token_id(lm: nn.Module, tok, names: tuple[str, ...]) -> int | None:
    """The first of the `names` ids found on the tokenizer, then the generation config, then the
    model config (a list of ids counts as its first)."""
    for source in (tok, getattr(lm, "generation_config", None), lm.config):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
    return None


def pad_id_of(lm: nn.Module, tok=None) -> int:
    found = _token_id(lm, tok, ("pad_token_id", "eos_token_id"))
    return 0 if found is None else found  # no pad and no eos anywhere: padded slots are masked, so any id does


def eos_id_of(lm: nn.Module, tok=None) -> int | None:
    return _token_id(lm, tok, ("eos_token_id",))


@torch.no_grad()
def check_kv_shape(lm: nn.Module, shape: KVShape) -> None:
    """Run the LM on one token and compare its cache with the shape read from the config, so a
    config that describes its attention differently (multi-query flags, …) is caught here."""
    device = next(lm.parameters()).device
    x = torch.ones(1, 1, dtype=torch.long, device=device)
    out = lm(input_ids=x, attention_mask=torch.ones_like(x), use_cache=True)
    layers = getattr(returned_cache(out), "layers", None)
    if layers is None or len(layers) != shape.layers:
        raise PrefixError(f"{type(lm).__name__}: expected a cache of {shape.layers} layers from its config")
    got = {tuple(layer.keys.shape) for layer in layers} | {tuple(layer.values.shape) for layer in layers}
    want = (1, shape.heads, 1, shape.head_dim)
    if got != {want}:
        raise PrefixError(f"{type(lm).__name__}: its cache holds key/values of shape {sorted(got)}, the config "
                          f"says {want}; this architecture is not supported by prefix-tuning here")


# ----------------------------------------------------------------------------- save / load
def lm_entry(name: str, lm: nn.Module, trained: bool = False, weights: str | None = None) -> dict:
    """A saved generator's "backbone": the LM's name, the hashes of its weights (`weights`: of the ones a
    fine-tuned LM started from) and of its config.json (backbone.config_hash), the token ids its outputs
    start, pad and end with (backbone.decoding_ids), whether it was trained."""
    return {"name": name, "weights_hash": weights or weights_hash(lm), "config_hash": config_hash(lm),
            "decoding_ids": decoding_ids(lm), "trained": trained}


def save_prefix(folder: Path, prefix: Tensor, cfg: PrefixConfig, lm_name: str, lm: nn.Module,
                extra: dict | None = None, options: dict | None = None) -> None:
    """folder/model.safetensors: only the materialised prefix (N, 2, H, P, E); folder/config.json:
    method, task (generation: a tuner saved from Python is a text generator too, not a classifier), options (all
    of cfg's, or `options` where only some are known: an imported prefix; loading fills the rest with defaults,
    which a materialised prefix does not use), the LM (lm_entry), the prefix shape."""
    n, _, h, p, e = prefix.shape
    config = {"method": "prefix", "task": "generation", "architecture": "causal",
              "options": dataclasses.asdict(cfg) if options is None else options,
              "backbone": lm_entry(lm_name, lm),
              "prefix": {"layers": n, "kv_heads": h, "head_dim": e, "length": p}, **(extra or {})}
    write_saved(folder, {PREFIX_KEY: prefix.float()}, config)


ARCHITECTURES = {"causal": "a decoder-only (causal) LM", "encoder-decoder": "an encoder-decoder LM"}


def architecture(lm: nn.Module) -> str:
    """The kind of LM (a key of ARCHITECTURES); saved generators record it, so they are never loaded on the other."""
    return "encoder-decoder" if getattr(lm.config, "is_encoder_decoder", False) else "causal"


def read_prefix_folder(folder: Path, architecture: str) -> tuple[dict, dict[str, Tensor]]:
    """(config.json, tensors) of a saved prefix for an LM of `architecture` (causal / encoder-decoder);
    a PrefixError that says what the folder is otherwise. The tensors are parsed from the bytes whose
    checksum this config.json names (model.load_weights), so a folder replaced since the caller's own
    read is said, never read as one run's config with another's prefix."""
    from ..model import load_weights, read_config_json

    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise PrefixError(f"{folder}: no {name}; is this a folder written by a prefix-tuning run?")
    config = read_config_json(folder, PrefixError)
    if not isinstance(config, dict):
        raise PrefixError(f"{folder / CONFIG}: not a frozentune model config; is this a folder written by a "
                          f"prefix-tuning run?")
    if config.get("method") != "prefix":
        raise PrefixError(f"{folder}: holds a {config.get('method')!r} model, not a prefix")
    from ..registry import get_method
    from .run import check_generation_config

    check_generation_config(config, folder / CONFIG, get_method("prefix"))  # a hand edit named, not a KeyError later
    saved = config.get("architecture", "causal")
    if saved != architecture:
        raise PrefixError(f"{folder}: a prefix for {ARCHITECTURES.get(saved, saved)} cannot be loaded on "
                          f"{ARCHITECTURES[architecture]}; load it with the model it was trained on "
                          f"({config.get('backbone', {}).get('name') or 'not recorded'})")
    return config, load_weights(folder, config)


def saved_options(config: dict) -> PrefixConfig:
    known = {f.name for f in dataclasses.fields(PrefixConfig)}
    return PrefixConfig(**{k: v for k, v in config["options"].items() if k in known})


def check_fits(folder: Path, config: dict, lm: nn.Module, shapes: dict[str, tuple[KVShape, tuple[int, int, int]]]) -> None:
    """PrefixError unless each saved prefix (N, H, E) fits the LM's shape of that kind, and the LM's weights
    hash is the one saved (when one was); a ModelLoadError where its config hash is not (check_config_hash)."""
    name = config["backbone"].get("name") or "not recorded"
    for what, (want, (n, h, e)) in shapes.items():
        if (n, h, e) != (want.layers, want.heads, want.head_dim):
            raise PrefixError(f"{folder}: the {what} is for {n} layers × {h} kv heads × {e} dims; this model has "
                              f"{want.layers} × {want.heads} × {want.head_dim}. Load the model it was trained on "
                              f"({name}).")
    saved_hash = config["backbone"].get("weights_hash")
    if saved_hash and weights_hash(lm) != saved_hash:
        raise PrefixError(f"{folder}: this model's weights differ from the ones the prefix was trained on "
                          f"({name}); load the same model files.")
    check_config_hash(folder, config["backbone"], lm, "language model")


def load_prefix(folder: Path, lm: nn.Module | None = None) -> tuple[Tensor, PrefixConfig, dict]:
    """(prefix (N, 2, H, P, E), options, config.json). With `lm`, the prefix must fit its attention
    and, when a hash was saved, its weights must be the ones it was trained with."""
    folder = Path(folder)
    config, state = read_prefix_folder(folder, "causal")
    if set(state) != {PREFIX_KEY}:
        raise PrefixError(f"{folder / WEIGHTS}: expected one tensor {PREFIX_KEY!r}, found {sorted(state)}")
    prefix = state[PREFIX_KEY]
    s = config["prefix"]
    if tuple(prefix.shape) != (s["layers"], 2, s["kv_heads"], s["length"], s["head_dim"]):
        raise PrefixError(f"{folder}: prefix tensor {tuple(prefix.shape)} does not match config.json {s}")
    if lm is not None:
        n, _, h, _, e = prefix.shape
        check_fits(folder, config, lm, {"prefix": (KVShape.from_config(lm.config), (n, h, e))})
    return prefix, saved_options(config), config

