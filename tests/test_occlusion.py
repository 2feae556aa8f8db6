"""Occlusion (`explain --occlusion`): each word cut out in turn, the drop of the predicted label's
probability. Its words and cuts, its ranking against a model whose answer is known, and its numbers
against `predict` on the cut texts, for a single-text model without an explanation of its own, a head with
one, and a pair model."""
import json

import numpy as np
import pytest
import torch

from frozentune.cli import main
from frozentune.head import TokenView
from frozentune.occlusion import occlude, without, words
from numerics import dot, linear, softmax, tol, transformer


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def view_of(text: str, pieces: list[tuple[str, int, int, int | None]]) -> TokenView:
    """A TokenView from (piece, start, end, word) rows, with [CLS] and [SEP] around them."""
    return TokenView(text, ["[CLS]"] + [p[0] for p in pieces] + ["[SEP]"],
                     [(0, 0)] + [(p[1], p[2]) for p in pieces] + [(0, 0)], [None] + [p[3] for p in pieces] + [None])


def test_words_are_the_tokenizers_whole_words_once_each_and_a_whole_text_is_never_cut():
    text = "unbelievably dull , truly"
    v = view_of(text, [("un", 0, 2, 0), ("##believ", 2, 8, 0), ("##ably", 8, 12, 0), ("dull", 13, 17, 1),
                       (",", 18, 19, 2), ("truly", 20, 25, 3)])
    assert words(v) == [(0, 12, None), (13, 17, None), (18, 19, None), (20, 25, None)]
    assert without(text, (13, 17, None)) == "unbelievably  , truly"  # the rest kept as it is
    assert without("dull", (0, 4, None)) is None and without("dull ", (0, 4, None)) is None
    assert without(("a b", "c"), (2, 3, 0)) == ("a ", "c") and without(("a b", "c"), (0, 1, 1)) is None


def test_occlusion_ranks_the_words_a_known_model_needs():
    """A model whose p("neg") is 0.9 while "dull" is in the text and 0.6 without it, and 0.95 while "bad"
    is too: dull and bad rank first, the rest (drop 0) keep the text's order; a one-word text is said."""
    def probabilities(texts):
        p = [0.6 + 0.3 * ("dull" in t.split()) + 0.05 * ("bad" in t.split()) for t in texts]
        return np.array([[q, 1 - q] for q in p])

    texts = ["a dull and bad film", "dull"]
    views = [view_of(texts[0], [("a", 0, 1, 0), ("dull", 2, 6, 1), ("and", 7, 10, 2), ("bad", 11, 14, 3),
                                ("film", 15, 19, 4)]),
             view_of(texts[1], [("dull", 0, 4, 0)])]
    full = [float(probabilities([t])[0, 0]) for t in texts]
    ex = occlude(texts, views, [0, 0], full, ["neg", "pos"], 3, probabilities)
    got = [(w["text"], w["drop"], w["without"]) for w in ex[0].data["words"]]
    assert got == [("dull", 0.3, 0.65), ("bad", 0.05, 0.9), ("a", 0.0, 0.95)]
    assert ex[0].data["label"] == "neg" and ex[0].data["probability"] == 0.95
    assert ex[0].lines[0] == 'without "dull": neg 0.95 → 0.65'
    assert ex[1].data["words"] == [] and "one word is the whole text" in ex[1].lines[-1]


@pytest.fixture(scope="module")
def models(tiny_bert, trec_slice, tmp_path_factory):
    """A probe (no explanation of its own) and a space head on the TREC slice, fp32."""
    root = tmp_path_factory.mktemp("occlusion")
    out = {}
    for method in ("probe", "space"):
        out[method] = root / method
        assert main([str(a) for a in ("train", "--method", method, "--data", trec_slice, "--backbone", tiny_bert,
                                      "--max-length", 32, "--epochs", 2, "--precision", "fp32", "--output",
                                      out[method], "--cache-dir", root / "cache", "--quiet")]) == 0
    return out


def check_against_predict(rows: list[dict], model) -> None:
    """Every listed word's `without` is predict's probability of the label on the text with that word cut
    out; `probability` is the row's own. Within float32 rounding of the tiny 2-layer pass (the cut texts are
    read in other batches, padded otherwise) plus the 4 decimal places the explanation keeps."""
    from frozentune import api

    cut, want, got = [], [], []
    for r in rows:
        occ = r["explanation"]["occlusion"]
        assert occ["label"] == r["label"] and occ["probability"] == round(r["scores"][r["label"]], 4)
        text = (r["text"], r["text_pair"]) if "text_pair" in r else r["text"]
        for w in occ["words"]:
            source = text[w.get("part") or 0] if isinstance(text, tuple) else text
            assert source[w["start"]:w["end"]] == w["text"]
            cut.append(without(text, (w["start"], w["end"], w.get("part"))))
            got.append(w["without"])
        want += [r["label"]] * len(occ["words"])
        drops = [w["drop"] for w in occ["words"]]
        assert drops == sorted(drops, reverse=True)
    assert cut, "no word was listed"
    expected = [p["scores"][lab] for p, lab in zip(api.predict(model, cut, precision="fp32"), want)]
    bound = tol(torch.float32, transformer(2, 32, 64, 32, 8) + dot(32) + linear(32) + softmax(6)) * 2 + 0.5e-4
    assert np.abs(np.array(got) - np.array(expected)).max() <= bound


def test_explain_occlusion_for_a_probe_and_a_head_with_its_own(models, capsys):
    texts = ["How far is Denver from Aspen ?", "Who wrote Hamlet ?"]
    code, _, err = run(capsys, "explain", "--model", models["probe"], *texts)
    assert code == 2 and "--occlusion" in err  # the probe has no explanation of its own: the error says what does
    code, out, err = run(capsys, "explain", "--model", models["probe"], "--occlusion", "--top", 3, "--json", *texts)
    assert code == 0, err
    rows = json.loads(out)
    assert [len(r["explanation"]["occlusion"]["words"]) for r in rows] == [3, 3]
    assert set(rows[0]["explanation"]) == {"occlusion"}
    check_against_predict(rows, models["probe"])
    code, out, err = run(capsys, "explain", "--model", models["space"], "--occlusion", "--json", *texts)
    assert code == 0, err
    rows = json.loads(out)
    assert set(rows[0]["explanation"]) == {"classes", "occlusion"}  # its own explanation is kept beside it
    assert len(rows[1]["explanation"]["occlusion"]["words"]) == 4  # Who wrote Hamlet ?: 4 words, 5 asked for
    check_against_predict(rows, models["space"])
    code, out, err = run(capsys, "explain", "--model", models["space"], "--occlusion", *texts)
    assert code == 0 and "each word cut out in turn (occlusion):" in out and '  without "' in out, err
    assert "(4 of the 5 asked for: the text has no more words)" in out


def test_explain_occlusion_on_pairs(monkeypatch, mrpc_slice, tiny_bert, tmp_path, capsys):
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    out = tmp_path / "pair"
    code, _, err = run(capsys, "train", "--method", "probe", "--data", "mrpc", "--backbone", tiny_bert, "--max-length",
                       64, "--epochs", 1, "--precision", "fp32", "--output", out, "--cache-dir", tmp_path / "c",
                       "--quiet")
    assert code == 0, err
    code, said, err = run(capsys, "explain", "--model", out, "--occlusion", "--top", 50, "--json", "--pair",
                          "The cat sat on the mat .", "A cat was sitting .")
    assert code == 0, err
    rows = json.loads(said)
    listed = rows[0]["explanation"]["occlusion"]["words"]
    assert sorted((w["part"], w["start"]) for w in listed) == [(0, 0), (0, 4), (0, 8), (0, 12), (0, 15), (0, 19), (0, 23),
                                                               (1, 0), (1, 2), (1, 6), (1, 10), (1, 18)]
    check_against_predict(rows, out)
