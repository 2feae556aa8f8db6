"""Space Model specifics: centroids over real tokens, the two auxiliary losses, hand-computed values,
explanation and the concept-space picture."""
import json
import math
from pathlib import Path

import numpy as np
import torch

from frozentune.cli import main
from frozentune.head import Features, TokenView
from frozentune.heads.space import (VAR_EPS, SpaceConfig, SpaceHead, attributions, centroids,
                                    inter_space_loss, intra_space_loss, token_logits)
from numerics import ACTIVATION, ROUNDING, approx, assert_close, assert_differs, dot, linear, softmax, sum_of_abs


def centroid_ops(D: int, T: int) -> int:
    """A centroid: tanh of a D-term projection, the (masked) sum over T tokens, the division by the count."""
    return dot(D) + ACTIVATION + dot(T) + 1


def variance_ops(D: int, T: int) -> int:
    """A variance: the centroid, subtract and square (2), the sum over T tokens, the division."""
    return centroid_ops(D, T) + 2 + dot(T) + 1


def test_padding_does_not_change_centroids_or_logits():
    torch.manual_seed(0)
    head = SpaceHead(SpaceConfig(concept_dim=4), dim=8, num_labels=3).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    x_padded = torch.cat([x, 7.0 * torch.randn(2, 4, 8)], 1)  # garbage on the padding
    mask_padded = torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], 1)
    a, b = head(Features(x, mask)), head(Features(x_padded, mask_padded))
    # T = 5 vs 9: the sums over tokens run over more (zero-weighted) terms, in another blocking
    assert_close(a.extras["centroids"], b.extras["centroids"], ops=centroid_ops(8, 9), what="centroids")
    assert_close(a.extras["concept_variance"], b.extras["concept_variance"], ops=variance_ops(8, 9),
                 scale=1.0, what="variances")  # scale: the attributions' size (|tanh| ≤ 1) the squares come from
    assert_close(a.logits, b.logits, ops=centroid_ops(8, 9) + linear(3 * 4), what="logits")
    # the published (unmasked) mean does depend on padding: the option really switches it
    head.cfg.masked_mean = False
    a, b = head(Features(x, mask)), head(Features(x_padded, mask_padded))
    assert_differs(a.extras["centroids"], b.extras["centroids"], ops=centroid_ops(8, 9), what="unmasked centroids")


def test_intra_space_loss_is_finite_when_collapsed_and_falls_as_vectors_spread():
    mask = torch.ones(1, 4, dtype=torch.bool)
    values = []
    for spread in (0.0, 0.1, 0.3, 0.6):
        c = torch.zeros(1, 2, 4, 3)  # (B, n, T, m): four token vectors per space
        c[:, :, ::2] += spread
        c[:, :, 1::2] -= spread
        _, var = centroids(c, mask)
        values.append(float(intra_space_loss(var)))
    # variance exactly 0; ε rounded to float32, 1/x, the mean over 2·3 equal entries
    assert math.isfinite(values[0]) and values[0] == approx(1.0 / VAR_EPS, ops=ROUNDING + 1 + dot(6) + 1)
    assert values == sorted(values, reverse=True) and len(set(values)) == 4
    # ±0.3 rounded to float32, mean and variance over 4 tokens, + ε, 1/x, the mean over 6 (all well conditioned)
    assert values[2] == approx(1.0 / (0.3 ** 2 + VAR_EPS), ops=ROUNDING + 2 * (dot(4) + 2) + 2 + dot(6) + 1)


def test_two_classes_m2_hand_computed():
    """E = [[1, 0], [0, 1], padding]; P_0 = I, P_1 = −I; output layer set by hand."""
    cfg = SpaceConfig(concept_dim=2, intra_weight=0.5, inter_weight=0.25)
    head = SpaceHead(cfg, dim=2, num_labels=2)
    with torch.no_grad():
        head.operators.copy_(torch.stack([torch.eye(2), -torch.eye(2)]))
        head.out.weight.copy_(torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.0, 1.0, 0.0]]))
        head.out.bias.copy_(torch.tensor([0.1, -0.2]))
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])
    mask = torch.tensor([[True, True, False]])
    out = head(Features(x, mask))
    t = math.tanh(1.0)
    k0, k1 = [t / 2, t / 2], [-t / 2, -t / 2]
    # float32 against float64 hand values: D = 2, T = 3 (one token masked)
    assert out.extras["centroids"][0].flatten().tolist() == approx(k0 + k1, ops=centroid_ops(2, 3))
    assert out.extras["concept_variance"][0].flatten().tolist() == approx([t * t / 4] * 4, ops=variance_ops(2, 3),
                                                                            scale=t)  # scale: |C| the squares come from
    z0 = 1.0 * k0[0] + 2.0 * k0[1] + 0.0 * k1[0] - 1.0 * k1[1] + 0.1
    z1 = 0.5 * k0[0] + 0.0 * k0[1] + 1.0 * k1[0] + 0.0 * k1[1] - 0.2
    assert out.logits[0].tolist() == approx([z0, z1], ops=centroid_ops(2, 3) + linear(4), scale=2.0)  # Σ|w·k| ≈ 2
    ce = -z0 + math.log(math.exp(z0) + math.exp(z1))  # true class 0
    intra = 1.0 / (t * t / 4 + VAR_EPS)
    inter = ((1 - k0[0]) + (1 - k0[1]) + (1 + k1[0]) + (1 + k1[1])) / 4
    expected = ce + 0.5 * intra + 0.25 * inter
    # CE (softmax over 2, log) on the logits, 1/(var + ε) and 1 − y·k each averaged over 4, the weighted sum
    loss_ops = centroid_ops(2, 3) + linear(4) + softmax(2) + ACTIVATION + variance_ops(2, 3) + 2 + dot(4) + 1 + 3
    assert head.loss(out, torch.tensor([0])).item() == approx(expected, ops=loss_ops)


def test_inter_space_loss_pushes_true_class_up_and_others_down():
    labels = torch.tensor([1])
    ideal = torch.tensor([[[-1.0, -1.0], [1.0, 1.0]]])  # (B, n, m): true class at +1, other at −1
    # exact: ±1, 0, 1 − y·k and their mean over 4 are small binary numbers, computed without rounding
    assert float(inter_space_loss(ideal, labels)) == 0.0
    assert float(inter_space_loss(-ideal, labels)) == 2.0
    assert float(inter_space_loss(torch.zeros(1, 2, 2), labels)) == 1.0


def test_attributions_match_a_per_class_loop():
    torch.manual_seed(1)
    x, ops = torch.randn(2, 5, 6), torch.randn(3, 6, 4)
    c = attributions(x, ops)  # (B, n, T, m)
    for i in range(3):
        # one (D, n·m) product vs n (D, m) products: another blocking of the 6-term sums; |tanh'| ≤ 1
        assert_close(c[:, i], torch.tanh(x @ ops[i]), ops=dot(6) + ACTIVATION, scale=sum_of_abs(x, ops[i]),
                     what=f"class {i}")


def test_token_logits_add_up_to_the_logits_and_rank_the_explanation():
    """The classifier is linear over means of per-token attributions, so each logit is its bias plus the
    tokens' shares, masked or (the published mean) not; explain ranks a class's words by its share less
    the mean share of every class. It ranked them by the attribution alone, which on SST-5 picked words no
    better than random (bench/faithfulness.py)."""
    torch.manual_seed(2)
    head = SpaceHead(SpaceConfig(concept_dim=4), dim=8, num_labels=3).eval()
    x = torch.randn(2, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    for masked in (True, False):
        head.cfg.masked_mean = masked
        out = head(Features(x, mask))
        share = out.extras["token_logits"]  # (B, n, T)
        # the same 3·4 products and 6 token terms summed in another order, plus the bias, against logits
        # summed as centroids first; terms of size |w|·|tanh| ≤ |w|
        assert_close(share.sum(-1) + head.out.bias, out.logits, ops=centroid_ops(8, 6) + linear(3 * 4) + dot(6),
                     scale=float(head.out.weight.detach().abs().sum(1).max()) + float(head.out.bias.detach().abs().max()),
                     what=f"tokens' shares + bias (masked={masked})")
        if masked:
            assert (share[1, :, 4:] == 0).all()  # padding has no share of a masked mean
        assert token_logits(attributions(x, head.operators), mask, head.out.weight, masked).shape == (2, 3, 6)
    head.cfg.masked_mean = True
    with torch.no_grad():  # as explain runs it
        out = head(Features(x[:1], mask[:1]))
    pieces = ["[CLS]", "a", "b", "c", "d", "[SEP]"]
    view = TokenView("a b c d", pieces, [(0, 0), (0, 1), (2, 3), (4, 5), (6, 7), (0, 0)], [None, 0, 1, 2, 3, None])
    ex = head.explain(out, view, ["x", "y", "z"], top=4).data["classes"]
    share = out.extras["token_logits"][0]
    for c, lab in enumerate(["x", "y", "z"]):
        lift = (share[c] - share.mean(0))[1:5]  # the four words
        want = [pieces[1 + int(i)] for i in lift.argsort(descending=True)]
        assert [t["text"] for t in ex[lab]["tokens"]] == want
        assert [t["weight"] for t in ex[lab]["tokens"]] == [round(float(v), 4) for v in lift.sort(descending=True).values]


def run(capsys, *args):
    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_space_explain_and_plot_concepts(tiny_bert, trec_slice, tmp_path, capsys):
    out = tmp_path / "space"
    code, _, err = run(capsys, "train", "--method", "space", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-length", 32, "--epochs", 1, "--output", out, "--cache-dir", tmp_path / "cache",
                       "--quiet")
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    labels, m = config["labels"], SpaceConfig().concept_dim
    code, stdout, err = run(capsys, "explain", "--model", out, "Who invented the telephone ?", "--top", 2, "--json")
    assert code == 0, err
    assert "truncated" not in json.loads(stdout)[0]
    # a text that reached --max-length says so in explain's JSON and text, as predict's (it was in the log only)
    long = "Who invented the telephone and " * 20 + "why ?"
    code, said, err = run(capsys, "explain", "--model", out, long, "--top", 2, "--json")
    assert code == 0 and json.loads(said)[0]["truncated"] is True, err
    code, said, err = run(capsys, "explain", "--model", out, long, "--top", 2)
    assert code == 0 and "(truncated: it reached --max-length" in said, err
    ex = json.loads(stdout)[0]["explanation"]["classes"]
    assert set(ex) == set(labels)
    for row in ex.values():
        assert len(row["centroid"]) == m and all(-1 <= v <= 1 for v in row["centroid"])
        assert len(row["tokens"]) == 2
        assert all(t["text"] in "Who invented the telephone ?" for t in row["tokens"])  # words, not [CLS]
        assert all("Who invented the telephone ?"[t["start"]:t["end"]] == t["text"] for t in row["tokens"])

    png = tmp_path / "pic" / "concepts.png"
    code, stdout, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--output", png,
                            "--cache-dir", tmp_path / "cache", "--max-points", 40)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "silhouette" in stdout and "40 of" in stdout
    # the output is checked before any work (a traceback after the whole pass), and named as written
    (tmp_path / "afile").write_text("x")
    for bad, says in ((tmp_path / "pic", "is a folder"), (tmp_path / "afile" / "x.png", "is a file, so the folder")):
        code, _, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--output", bad,
                           "--cache-dir", tmp_path / "cache")
        assert code == 2 and says in err, err
    # paths os.access called writable: a dangling link, a name too long (and /proc or /sys, for root): a traceback
    # after the whole pass, now refused first
    (tmp_path / "dangling.png").symlink_to(tmp_path / "gone" / "x.png")
    for bad in (tmp_path / "dangling.png", tmp_path / ("a" * 300 + ".png")):
        code, _, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--output", bad,
                           "--cache-dir", tmp_path / "cache")
        assert code == 2 and "cannot be written" in err and "Traceback" not in err, err
    assert (tmp_path / "dangling.png").is_symlink()
    code, stdout, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--output", tmp_path / "bare",
                            "--cache-dir", tmp_path / "cache", "--max-points", 3)  # 3 points: fewer labels than the
    assert code == 0, err                                                         # silhouette needs, no sklearn error
    assert (tmp_path / "bare.png").is_file() and str(tmp_path / "bare.png") in stdout
    assert "no silhouette (nan): it needs 2 to 2 distinct labels among the 3 points" in err  # nan was unexplained
    code, _, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--output", tmp_path / "c.jpg")
    assert code == 2 and "writes a PNG; give a .png name" in err  # was written as c.jpg.png
    # the model's own folder, where the picture goes by default, is checked before any work too, and the message
    # names what to pass (it named an --output the user had not given, after the whole pass)
    import frozentune.api as A

    real_access = A.os.access
    A.os.access = lambda p, mode: Path(p) != out and real_access(p, mode)
    try:
        code, _, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--cache-dir", tmp_path / "c2")
    finally:
        A.os.access = real_access
    assert code == 2 and "goes into the model's folder unless --output says where; pass --output FILE.png" in err, err
    assert not (tmp_path / "c2").exists()  # refused before any extraction
    # its picture in the model's own folder (the default) is frozentune's: train --overwrite may replace it
    code, stdout, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--cache-dir", tmp_path / "cache",
                            "--max-points", 10)
    assert code == 0 and list(out.glob("concepts-*.png")), err
    code, _, err = run(capsys, "train", "--method", "space", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-length", 32, "--epochs", 1, "--output", out, "--overwrite", "--cache-dir", tmp_path / "cache",
                       "--quiet")
    assert code == 0, err


def test_plot_concepts_refuses_other_methods(tiny_bert, trec_slice, tmp_path, capsys):
    out = tmp_path / "probe"
    code, _, err = run(capsys, "train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-length", 32, "--epochs", 1, "--output", out, "--cache-dir", tmp_path / "cache", "--quiet")
    assert code == 0, err
    code, _, err = run(capsys, "plot-concepts", "--model", out, "--data", trec_slice, "--cache-dir", tmp_path / "cache")
    assert code == 2 and "holds a 'probe' model" in err


def test_space_reads_its_own_default_layer_unless_told(tiny_bert, trec_slice, tmp_path, capsys):
    """`space` registers the layer it reads by default (chosen on validation, bench/REPORT.md);
    --layer overrides it; other methods keep the last layer; the saved model records the layer."""
    import dataclasses

    from frozentune import api
    from frozentune.backbone import LayerSpec
    from frozentune.registry import get_method
    own = get_method("space").layer
    assert own is not None and LayerSpec.parse(own) != LayerSpec((-1,))
    opts = api.BackboneOptions(str(tiny_bert), max_length=16)
    assert api.backbone_for("space", opts).layers == LayerSpec.parse(own)
    assert api.backbone_for("probe", opts).layers == LayerSpec((-1,))
    assert api.backbone_for("space", dataclasses.replace(opts, layers="-1")).layers == LayerSpec((-1,))
    out = tmp_path / "space"
    code, _, err = run(capsys, "train", "--method", "space", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-length", 32, "--epochs", 1, "--output", out, "--cache-dir", tmp_path / "cache", "--quiet")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["backbone"]["layers"] == list(LayerSpec.parse(own).layers)
    code, stdout, _ = run(capsys, "list")
    assert f"reads backbone layer {own}" in stdout


def test_pictures_leave_the_callers_matplotlib_backend_alone(tmp_path):
    """plot_concepts (and the sweep's plot, through the same plot.figure) switched matplotlib to Agg for
    the whole process: a notebook's own plt.show() drew nothing afterwards, without a word."""
    import matplotlib
    import matplotlib.pyplot as plt

    from frozentune.plot import plot_concepts

    before = matplotlib.get_backend()
    try:
        matplotlib.use("pdf")  # any backend but Agg, one that needs no display
        rng = np.random.default_rng(0)
        for m in (3, 4):  # one 3-D panel per class, and the projection of the concatenated centroids
            plot_concepts(rng.normal(size=(20, 2, m)), np.arange(20) % 2, ["a", "b"], tmp_path / f"{m}.png", "t")
            assert (tmp_path / f"{m}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.get_backend() == "pdf" and plt.get_fignums() == []  # none left open in pyplot either
    finally:
        matplotlib.use(before)
