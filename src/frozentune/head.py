"""The interface every classification head implements.

Legend: B batch, T tokens, D hidden size of the frozen states, C classes.
"""
from __future__ import annotations

import contextlib
import unicodedata

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pairs import Text


_Made = TypeVar("_Made")


def kept_from_weights(module: nn.Module, slot: str, make: Callable[[], _Made], *extra: Hashable) -> _Made:
    """make(): something inference derives from `module`'s weights alone, made once and kept in
    module.__dict__[slot] (not a buffer: never saved), and made again when a parameter was replaced
    or changed in place (its storage or version differs: an optimiser step, load_state_dict) or
    `extra` differs. Made fresh and not kept while traced, compiled or exported (a traced tensor has
    neither storage nor version)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return make()
    key = (extra, tuple((p.data_ptr(), p._version) for p in module.parameters()))
    kept = module.__dict__.get(slot)
    if kept is not None and kept[0] == key:
        return kept[1]
    made = make()
    module.__dict__[slot] = (key, made)
    return made


@dataclass
class Features:
    hidden: Tensor  # (B, T, D) frozen token states, float32
    mask: Tensor    # (B, T) bool, True on real tokens
    separator: Tensor | None = None  # (B, T) bool, True on the tokens between a pair's two texts; None for single texts
    precision: str = "fp32"  # of the frozen pass that made `hidden`: a head may run its no-grad products in it


def _extends(c: str) -> bool:
    """Whether `c` belongs to the character before it on screen: a combining mark (an accent written
    apart, as NFD text has it), a variation selector (❤ + U+FE0F), a skin-tone modifier, a zero-width
    joiner or non-joiner."""
    o = ord(c)
    return (unicodedata.category(c) in ("Mn", "Me", "Mc") or 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF
            or 0x1F3FB <= o <= 0x1F3FF or o in (0x200C, 0x200D))


def whole_characters(text: Text, offsets: list[tuple[int, int]], seqs: list[int | None]) -> list[tuple[int, int]]:
    """`offsets` (a tokenizer's character spans) with each end moved past the marks that belong to its last
    character (_extends) and that no piece starts at: an uncased BERT strips accents, so the piece of an NFD
    "résumé" ended before its last accent and explanations showed "résume", and "❤️" lost its selector."""
    out = list(offsets)
    parts = text if isinstance(text, tuple) else (text,)
    part_of = (lambda t: seqs[t] or 0) if seqs else (lambda t: 0)
    starts = {(part_of(t), s) for t, (s, e) in enumerate(out) if e > s and (not seqs or seqs[t] is not None)}
    for t, (s, e) in enumerate(out):
        if e <= s or (seqs and seqs[t] is None):
            continue
        p = part_of(t)
        src = parts[p] if p < len(parts) else ""
        while e < len(src) and _extends(src[e]) and (p, e) not in starts:
            e += 1
        out[t] = (s, e)
    return out


@dataclass
class TokenView:
    """One input as the backbone saw it: its word pieces (special tokens included), the character
    span of each in the original text ((0, 0) for special tokens) and the tokenizer's word index
    of each (None for special tokens), so that pieces can be shown as the words they belong to.

    For a sentence pair, `text` is the pair (first, second) and `seqs` says which of the two each
    piece comes from (0, 1; None for special tokens); its character spans are offsets into that
    text. A group of pieces from both texts has no one character range (see `char_range`)."""
    text: Text
    pieces: list[str]
    offsets: list[tuple[int, int]]
    words: list[int | None] = field(default_factory=list)
    seqs: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = whole_characters(self.text, self.offsets, self.seqs)

    def read_to(self) -> list[int]:
        """Per text (one, or a pair's two): the characters read, up to the end of its last piece; less than the
        text's length where it was cut at max_length."""
        ends = [0, 0] if self.seqs else [0]
        for i, (s, e) in enumerate(self.offsets):
            if e > s:
                ends[self.part(i)] = max(ends[self.part(i)], e)
        return ends

    def part(self, i: int) -> int:
        """Which text piece i comes from: 0 for a single text; 0 or 1 in a pair (None-marked special
        tokens count with the text before them)."""
        if not self.seqs:
            return 0
        while i > 0 and self.seqs[i] is None:
            i -= 1
        return self.seqs[i] or 0

    def widen(self, i: int, j: int) -> tuple[int, int]:
        """Pieces i..j grown to whole words: a span that starts or ends inside a word takes all of it
        (word indices restart in a pair's second text, so growth stays inside the piece's own text)."""
        w, same = self.words, (lambda a, b: not self.seqs or self.seqs[a] == self.seqs[b])
        if not w:
            return i, j
        while i > 0 and w[i] is not None and w[i - 1] == w[i] and same(i - 1, i):
            i -= 1
        while j + 1 < len(w) and w[j] is not None and w[j + 1] == w[j] and same(j, j + 1):
            j += 1
        return i, j

    def char_range(self, i: int, j: int | None = None, whole_words: bool = True) -> tuple[int, int] | None:
        """Character range [start, end) of pieces i..j (inclusive; j defaults to i) in the text they
        come from (`part`), grown to whole words unless whole_words=False; None when they are all
        special tokens, or when they come from both texts of a pair."""
        j = i if j is None else j
        if whole_words:
            i, j = self.widen(i, j)
        real = [t for t in range(i, j + 1) if self.offsets[t][1] > self.offsets[t][0]]
        if not real or (self.seqs and len({self.seqs[t] for t in real}) > 1):
            return None
        return self.offsets[real[0]][0], self.offsets[real[-1]][1]

    def text_pieces(self) -> list[int]:
        """Indices of the pieces that have characters in the text (special tokens left out); every
        piece when none has."""
        real = [t for t, (s, e) in enumerate(self.offsets) if e > s]
        return real or list(range(len(self.pieces)))

    def _first_real(self, i: int, j: int) -> int:
        """The first piece of i..j (grown to whole words) that has characters; i when none has."""
        i, j = self.widen(i, j)
        return next((t for t in range(i, j + 1) if self.offsets[t][1] > self.offsets[t][0]), i)

    def source(self, i: int) -> str:
        """The text piece i comes from: the single text, or the pair's first or second."""
        return self.text[self.part(i)] if isinstance(self.text, tuple) else self.text

    def surface(self, i: int, j: int | None = None, whole_words: bool = True) -> str:
        """The original text of pieces i..j (see char_range), or the pieces themselves when they
        are all special tokens (or span both texts of a pair)."""
        j = i if j is None else j
        chars = self.char_range(i, j, whole_words)
        if chars is None:
            return " ".join(self.pieces[i:j + 1])
        return self.source(self._first_real(i, j))[chars[0]:chars[1]]

    def weighted(self, i: int, weight: float, j: int | None = None) -> dict:
        """Pieces i..j (j defaults to i) as an explanation shows them: {text, start, end, weight}, the
        text and character range [start, end) of their whole words (start/end null when they are all
        special tokens), weight rounded to 4 places. For a pair, also `part`: 0 when the range is in
        the first text, 1 in the second, null when it has none."""
        j = i if j is None else j
        chars = self.char_range(i, j)
        out = {"text": self.surface(i, j), "start": chars[0] if chars else None, "end": chars[1] if chars else None,
               "weight": round(weight, 4)}
        if self.seqs:
            out["part"] = self.part(self._first_real(i, j)) if chars else None
        return out

    def ranked(self, candidates: Iterable[tuple[int, int, float]], top: int) -> list[dict]:
        """The first `top` distinct entries of `candidates` ((i, j, weight) pieces i..j, largest weight
        first) as `weighted` shows them. Candidates that show the same words (the pieces of one word,
        or spans that grow to the same whole words) are one entry, with the first, largest weight:
        an explanation lists a word once, not once per piece of it."""
        out: list[dict] = []
        seen: set[tuple] = set()
        for i, j, weight in candidates:
            if len(out) == top:
                break
            shown_ = self.weighted(i, weight, j)
            key = ((shown_["start"], shown_["end"], shown_.get("part")) if shown_["start"] is not None
                   else ("special",) + self.widen(i, j))
            if key not in seen:
                seen.add(key)
                out.append(shown_)
        return out


LINES_SHOWN = 8  # classes an explanation's text lines show (the page draws as many); its data keeps every class


def lined_classes(logits: Tensor, labels: list[str]) -> tuple[list[int], list[str]]:
    """(the classes an explanation's per-class text lines show, the line saying what was left out): every
    class in label order up to LINES_SHOWN of them; beyond, the LINES_SHOWN likeliest, likeliest first
    (a thousand lines would bury the prediction's own). logits (C,)."""
    if len(labels) <= LINES_SHOWN:
        return list(range(len(labels))), []
    order = [int(i) for i in logits.float().argsort(descending=True)[:LINES_SHOWN]]
    return order, [f"({LINES_SHOWN} of the {len(labels):,} classes shown, the likeliest; the explanation's data "
                   f"holds every class: explain --json)"]


def fewer_note(shown: int, top: int, why: str) -> list[str]:
    """The line an explanation adds when it lists fewer entries than `top` asked for (why: the reason,
    e.g. the text has no more words), so a short list is not read as a cut-off; [] otherwise."""
    return [f"({shown} of the {top} asked for: {why})"] if shown < top else []


def part_mark(piece: dict) -> str:
    """" (1st)" / " (2nd)": which text of a sentence pair a weighted piece (TokenView.weighted) is in,
    since the same word may be in both; "" for a single text or a piece with no characters."""
    part = piece.get("part")
    return "" if part is None else " (1st)" if part == 0 else " (2nd)"


def shown(piece: dict) -> str:
    """A weighted piece as an explanation's line shows it: its text, and part_mark."""
    return piece["text"] + part_mark(piece)


@dataclass
class Explanation:
    """What a head says about one prediction: `data` is JSON-serialisable, `lines` are for people."""
    data: dict
    lines: list[str]


@dataclass
class Output:
    logits: Tensor                              # (B, C) class scores; argmax is the prediction
    extras: dict[str, Tensor] = field(default_factory=dict)  # what the method can explain


# From this many labels a head whose cost grows faster than the labels says so as it starts (Head.cost_note)
MANY_LABELS = 100


class Head(nn.Module):
    """A trainable module over frozen token states. Subclasses set `forward`; the default loss
    is cross-entropy over the logits."""

    # --average-folds auto: whether, where cross-validation keeps this head, its weights are the mean of the
    # refit's and the fold models' (crossval.py). Set per head from development rows (bench/soup_dev.py):
    # the mean helped Y-Tuning and hurt the self-explaining head.
    average_folds = False
    # Output.extras that are additive parts of the logits (space's token_logits: logits = bias + their sum): divided
    # by a fitted temperature with the logits (Classifier.calibrated), so they stay parts of what is shown
    logit_parts: tuple[str, ...] = ()
    # Below --cv-below, how many standard errors the head's optimism-corrected held-out accuracy must beat the
    # logistic regression by for the run to keep the head (crossval.keep_regression): one, the one-standard-error
    # rule, unless development rows (bench/fallback_rules.py --score dev) showed the head losing where it was kept.
    fallback_margin = 1.0

    def forward(self, f: Features) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        """labels: (B,) int64 → scalar."""
        return F.cross_entropy(out.logits, labels)

    def explain(self, out: Output, tokens: TokenView, labels: list[str], top: int) -> Explanation:
        """Explain one prediction (`out` holds a batch of one). Heads that can explain override
        this; `explains(head)` tells whether one does."""
        raise NotImplementedError

    def cost_note(self) -> str | None:
        """A line for the run's log where this head's cost grows faster than its data (the number of labels):
        said at the start of training, not found out from a step time. None: nothing to say."""
        return None

    def static_shapes(self) -> contextlib.AbstractContextManager:
        """A context in which forward's tensor shapes follow the input's shapes alone, with no step that
        reads the data's values on the host (a count of valid items, a nonzero()): what a CUDA graph can
        record (serve/graphs.py). Heads whose forward is already so need not override this."""
        return contextlib.nullcontext()


def explains(head: Head | type[Head]) -> bool:
    """Whether a head (instance or class) overrides `Head.explain`."""
    cls = head if isinstance(head, type) else type(head)
    return cls.explain is not Head.explain


def masked_mean(hidden: Tensor, mask: Tensor) -> Tensor:
    """(B, T, D), (B, T) → (B, D): the mean over real tokens only."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
