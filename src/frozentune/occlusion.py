"""Occlusion: how much each word of a text matters to a prediction, measured by taking it away.

For a text x predicted ŷ with probability p(ŷ | x), each word w is cut out of the text and the same model
(backbone and head, live) reads what is left: drop(w) = p(ŷ | x) − p(ŷ | x without w). The words with the
largest drops are the ones the prediction needs; a negative drop is a word that argued against ŷ. This
explains any classifier, one extra pass per word, and says what it measures: a head's own explanation
(span weights, attention, attributions) is a quantity inside the model, which need not be what the
prediction depends on (bench/faithfulness.py measured Y-Tuning's label attention no better than random
words at that on SST-5, and occlusion ahead of every head's own explanation).

Words are the tokenizer's (its pre-tokenisation: "cookie-cutter" is three, 書 one), with their character
ranges as an explanation gives them. A word is cut as its characters; the rest of the text is kept as it
is. A word that is a whole text (a one-word text, or a pair's one-word side) is not cut: an empty text is
no input.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .head import Explanation, TokenView, fewer_note, part_mark
from .pairs import Text

Word = tuple[int, int, int | None]  # [start, end) in its text, and its part of a pair (None: a single text)


def words(view: TokenView) -> list[Word]:
    """The text's words, in order, each once: the tokenizer's word of each piece with characters (special
    tokens have none), as its whole-word character range and part."""
    out: dict[Word, None] = {}  # ordered, each word once (a word of several pieces comes once per piece)
    for i, (s, e) in enumerate(view.offsets):
        if e > s and (chars := view.char_range(i)) is not None:
            out[(chars[0], chars[1], view.part(i) if view.seqs else None)] = None
    return list(out)


def without(text: Text, word: Word) -> Text | None:
    """The text with `word` cut out, or None where nothing (or only spaces) would be left of its text."""
    start, end, part = word
    parts = list(text) if isinstance(text, tuple) else [text]
    k = part or 0
    rest = parts[k][:start] + parts[k][end:]
    if not rest.strip():
        return None
    parts[k] = rest
    return tuple(parts) if isinstance(text, tuple) else rest  # type: ignore[return-value]


# a text's words, each with the text cut without it, and whether a word was left uncut (it was a whole text)
Cuts = tuple[list[tuple[Word, Text]], bool]


def cuts(texts: Sequence[Text], views: Sequence[TokenView]) -> list[Cuts]:
    """Per text: each of its words with the text cut without it (a word that is a whole text is left
    out), and whether a word was left out so."""
    out = []
    for text, view in zip(texts, views):
        found = words(view)
        per = [(w, t) for w in found if (t := without(text, w)) is not None]
        out.append((per, len(per) < len(found)))
    return out


def occlude(texts: Sequence[Text], views: Sequence[TokenView], predicted: Sequence[int], full: Sequence[float],
            labels: Sequence[str], top: int, probabilities: Callable[[list[Text]], np.ndarray]) -> list[Explanation]:
    """Per text: its `top` words by drop in the predicted label's probability (full: p(ŷ | x) per text;
    predicted: ŷ's index). probabilities(texts) → (N, C) runs the model on the cut texts, all at once."""
    cut = cuts(texts, views)
    flat = [t for per, _ in cut for _, t in per]
    return ranked(texts, cut, predicted, full, labels, top,
                  probabilities(flat) if flat else np.zeros((0, len(labels))))


def ranked(texts: Sequence[Text], cut: Sequence[Cuts], predicted: Sequence[int], full: Sequence[float],
           labels: Sequence[str], top: int, probs: np.ndarray) -> list[Explanation]:
    """occlude's answer from the model's (N, C) probabilities of every text's cut texts, in `cut`'s order."""
    out, at = [], 0
    for text, y, p, (per, uncut) in zip(texts, predicted, full, cut):
        drops = [(w, p - float(probs[at + k, y]), float(probs[at + k, y])) for k, (w, _) in enumerate(per)]
        at += len(per)
        drops.sort(key=lambda d: -d[1])  # stable: equal drops keep the words' order
        shown = [_entry(text, w, d, q) for w, d, q in drops[:top]]
        lines = [f'without "{e["text"]}"{part_mark(e)}: {labels[y]} {p:.2f} → {e["without"]:.2f}' for e in shown]
        why = "one word is the whole text, and an empty text is no input" if uncut else "the text has no more words"
        lines += fewer_note(len(shown), top, why)
        out.append(Explanation({"label": labels[y], "probability": round(p, 4), "words": shown}, lines))
    return out


LINES_HEAD = "each word cut out in turn (occlusion):"


def with_occlusion(explanation: dict | None, lines: list[str], found: Explanation) -> tuple[dict, list[str]]:
    """An explanation (a head's own, or {} / None where it has none) and its lines, with occlusion's added."""
    return ({**(explanation or {}), "occlusion": found.data},
            lines + [LINES_HEAD] + [f"  {line}" for line in found.lines])


def _entry(text: Text, word: Word, drop: float, left: float) -> dict:
    """A word as the occlusion lists it: {text, start, end[, part], drop, without}."""
    start, end, part = word
    source = text[part or 0] if isinstance(text, tuple) else text
    e = {"text": source[start:end], "start": start, "end": end}
    if part is not None:
        e["part"] = part
    return {**e, "drop": round(drop, 4), "without": round(left, 4)}
