"""Sentence pairs: a premise and a hypothesis (NLI), two sentences (paraphrase), a question and a
passage, classified together.

A pair is a 2-tuple of strings `(first, second)` wherever a text goes in (`Text`). The backbone's
tokenizer encodes it as it encodes pairs — `tok(first, second)`: its separators, its token type
ids, truncation `longest_first` within max_length — so the frozen pass sees one sequence, and one
pass per pair. Gluing the two into one string (`glue`) is what a user had to do before; it is kept
here only for the benchmark that measures what pair encoding gains over it.

The separator between the two texts (`[SEP]` for BERT-style tokenizers, `</s></s>` for
RoBERTa-style ones) is learnt from the tokenizer's own template (`separator_ids`), so cached token
ids (which carry no sequence ids) can be split into the two texts again: `separator_mask`.

Legend: B batch, T tokens.
"""
from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

from .errors import FrozentuneError

Text = Union[str, tuple[str, str]]

# named datasets that are pairs: (first field, second field)
PAIR_FIELDS = {"snli": ("premise", "hypothesis"), "rte": ("premise", "hypothesis"),
               "mrpc": ("sentence1", "sentence2")}
# the class whose F1 a dataset reports beside accuracy and macro-F1
POSITIVE = {"mrpc": "equivalent"}


class PairError(FrozentuneError, ValueError):
    """Pairs and single texts mixed, or a pair given where single texts are expected (or the reverse)."""


def is_pair(text: object) -> bool:
    return isinstance(text, tuple) and len(text) == 2 and all(isinstance(t, str) for t in text)


def pair_kind(texts: Sequence[Text]) -> bool:
    """Whether `texts` are pairs (True) or single texts (False); a mix is a PairError."""
    pairs = [is_pair(t) for t in texts]
    if any(pairs) and not all(pairs):
        first_single = pairs.index(False)
        raise PairError(f"texts mix sentence pairs and single texts (item {first_single} is "
                        f"{type(texts[first_single]).__name__}); give all pairs or all single texts")
    for i, t in enumerate(texts):
        if not pairs[i] and not isinstance(t, str):
            as_pair = (" (a pair is a tuple: tuple(item), or [tuple(p) for p in pairs] for them all)"
                       if not isinstance(t, (str, bytes)) and hasattr(t, "__len__") and len(t) == 2 else "")
            what = (f"a {type(t).__name__} of {len(t)}" if isinstance(t, (tuple, list)) and len(t) != 2
                    else type(t).__name__)  # ("a", "b", "c"): a pair has two
            raise PairError(f"item {i} is {what}: give a string, or a pair (first, second) of strings" + as_pair)
    return bool(pairs) and pairs[0]


def unzip(texts: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    return [t[0] for t in texts], [t[1] for t in texts]


def glue(pair: tuple[str, str], joiner: str = " ") -> str:
    """The workaround pair encoding replaces: both texts as one string."""
    return pair[0] + joiner + pair[1]


def separator_ids(tok) -> tuple[int, ...]:
    """The token ids the tokenizer puts between the first and the second text of a pair (e.g. (102,)
    for BERT's [SEP], (2, 2) for RoBERTa's </s></s>); () for a tokenizer that adds none. Read from
    its own encoding of a two-word pair (needs a fast tokenizer, which reports sequence ids)."""
    cached = getattr(tok, "_frozentune_separator", None)
    if cached is not None:
        return cached
    if not getattr(tok, "is_fast", False):
        raise PairError("sentence pairs need a fast (Rust) tokenizer, which reports which text each token "
                        "comes from; save one with AutoTokenizer.from_pretrained(..., use_fast=True)")
    enc = tok("first", "second", add_special_tokens=True)
    seq = enc.sequence_ids(0)
    last_a = max(i for i, s in enumerate(seq) if s == 0)
    first_b = min(i for i, s in enumerate(seq) if s == 1)
    out = tuple(int(x) for x in enc["input_ids"][last_a + 1:first_b])
    try:
        tok._frozentune_separator = out
    except AttributeError:  # a tokenizer that refuses new attributes: recomputed each time
        pass
    return out


def separator_mask(ids: Tensor, mask: Tensor, sep: tuple[int, ...]) -> Tensor:
    """(B, T) token ids of pairs, (B, T) bool real tokens → (B, T) bool, True on the separator
    tokens between the two texts: the first occurrence of `sep` after the first token. All False
    for a row where it is not found, and for an empty `sep`."""
    B, T = ids.shape
    out = torch.zeros(B, T, dtype=torch.bool, device=ids.device)
    n = len(sep)
    if n == 0 or T < n + 1:
        return out
    hit = mask[:, 1:T - n + 1].clone()  # (B, T-n) candidate starts 1..T-n
    for k, s in enumerate(sep):
        hit &= ids[:, 1 + k:T - n + 1 + k] == s
    found = hit.any(1)  # (B,)
    start = hit.float().argmax(1) + 1  # (B,) first hit (position in ids)
    pos = torch.arange(T, device=ids.device)[None, :]
    return (pos >= start[:, None]) & (pos < start[:, None] + n) & found[:, None]
