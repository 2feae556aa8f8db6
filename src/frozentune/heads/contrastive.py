"""`contrastive`: SetFit's recipe (Tunstall et al., 2022, "Efficient Few-Shot Learning Without
Prompts") with every pair of a batch in one step.

SetFit fine-tunes a sentence encoder so that the cosine similarity of two examples' embeddings is
1 for the same class and 0 for different classes (CosineSimilarityLoss on sampled pairs), then
fits a logistic regression on the tuned embeddings. Its trainer samples pairs and encodes both
texts of every pair: with 16 examples of each of TREC's 6 classes its one epoch is 7,680 pairs, so
each text goes through the encoder about 160 times. Here a batch of B texts is encoded once and the
loss covers all B·(B-1)/2 pairs in it: 20 steps of 32 texts encode each of those 96 texts about 7
times.

- Embedding: the pooled last-layer states, L2-normalised (all-MiniLM-L6-v2's own pooling).
- Loss: (cos(e_i, e_j) - [y_i = y_j])², the mean over every pair of the batch. SetFit samples as
  many same-class pairs as different-class ones; `balance_pairs` weights the two kinds equally
  here. It is off: on development rows (bench/contrastive_dev.py, 4 samples each of TREC, SST-5
  and SST-2 at 16 per class) it gained 0.9-1.0 points on SST-5, lost 0.3-2.5 on TREC and tied on
  SST-2, at 20 and 40 steps (REPORT.md, "Few labels"). A
  linear layer learns the classes beside it from the embeddings with their gradient cut
  (cross-entropy), so that validation can score rounds.
- After training, that layer is solved exactly on the final embeddings of all of train: scikit-learn's
  LogisticRegression(C = logreg_c) objective (crossval.solve_linear), SetFit's head.
- The backbone (all of it, or its top `top_layers` blocks) is trained: a saved model holds it.
  Below --cv-below examples there is no validation split and no early stopping: the run trains a
  fixed schedule at a constant rate after warm-up, as SetFit does (`fixed_schedule_few_labels`).

The pair loss is over the whole batch, so it is not a mean of per-example losses and cannot be
split across data-parallel processes: under a launcher it refuses.

Legend: B batch, D hidden, C classes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import distributed
from ..head import Features, Output
from ..registry import MethodError, changed, register_method
from .probe import FinetuneConfig, LinearHead


@dataclass
class ContrastiveConfig(FinetuneConfig):
    train_backbone: bool = field(default=True, metadata={
        "help": "train the encoder with the pair loss (the point of this method; it cannot be turned off)"})
    logreg_c: float = field(default=1.0, metadata={
        "help": "inverse L2 strength of the logistic regression solved on the tuned embeddings after training "
                "(scikit-learn's C; SetFit's head is LogisticRegression() with C = 1)"})
    balance_pairs: bool = field(default=False, metadata={
        "help": "weight same-class and different-class pairs equally in the loss (SetFit samples as many of each); "
                "off: every pair of the batch counts the same, so with C balanced classes about 1/C of them are "
                "same-class"})

    def unused(self) -> list[tuple[list[str], str]]:
        """The saved linear layer is a logistic regression solved on the tuned embeddings after training,
        with no dropout in it: --dropout would reach only the stand-in layer that scores validation."""
        return super().unused() + [
            (changed(self, "dropout"), "does not reach the saved model: its linear layer is a logistic regression "
                                      "solved on the embeddings after training; regularise it with --logreg-c")]

    def validate(self) -> None:
        super().validate()
        if not self.train_backbone:
            raise ValueError("contrastive: train_backbone must be true (the pair loss trains the encoder); "
                             "for a linear layer on frozen states use --method probe")
        if not self.logreg_c > 0:
            raise ValueError(f"contrastive: logreg_c={self.logreg_c}; give a positive inverse L2 strength (1 is "
                             f"scikit-learn's default)")


def pair_loss(e: Tensor, labels: Tensor, balance: bool = False) -> Tensor:
    """(B, D) unit embeddings, (B,) int64 → scalar: SetFit's cosine-similarity loss, the mean of
    (cos(e_i, e_j) - [y_i = y_j])² over every pair i < j of the batch. balance: the mean of the
    same-class pairs' mean and the different-class pairs' mean instead (one kind alone where the
    batch has no pair of the other). A batch of one has no pair: 0, still connected to `e` so that
    backward runs."""
    b = e.shape[0]
    if b < 2:
        return (e * 0).sum()
    i, j = torch.triu_indices(b, b, 1, device=e.device)
    cos = (e[i] * e[j]).sum(-1)                      # (P,) P = B(B-1)/2
    same = labels[i] == labels[j]                    # (P,)
    err = (cos - same.to(cos.dtype)) ** 2            # (P,)
    if not balance or bool(same.all()) or not bool(same.any()):
        return err.mean()
    return (err[same].mean() + err[~same].mean()) / 2


class ContrastiveHead(LinearHead):
    """Normalised pooled states, trained so that cosine similarity tells the classes apart; a linear
    layer (logistic regression) on them."""

    solves_output = True  # train.fit solves `out` on the tuned embeddings after training (SetFit's head)
    fixed_schedule_few_labels = True  # api.train: below --cv-below, the fixed schedule without validation
    one_process_only = "its pair loss spans the whole batch"  # api.train refuses a launcher's ranks, saying why
    # api.train refuses a smaller --batch-size: a batch of one has no pair, so the encoder would not move
    min_batch_size = (2, "its loss compares the texts of a batch in pairs, and a batch of one has none")
    # not convex: LinearHead sets convex only where the backbone is frozen, and this config always trains it

    def convex_inputs(self, f: Features) -> Tensor:
        """(B, D) the unit embedding the linear layer reads."""
        return F.normalize(super().convex_inputs(f), dim=-1)

    def forward(self, f: Features) -> Output:
        e = self.convex_inputs(f)                    # (B, D)
        return Output(self.out(self.drop(e)), {"embedding": e})  # (B, C)

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        if distributed.world_size() > 1:  # api.train refuses before any work; this guards a direct fit
            raise MethodError(f"contrastive: {self.one_process_only}, so it cannot be split across data-parallel "
                              f"processes; run it in one process (without torchrun / accelerate launch)")
        e = out.extras["embedding"]
        # the linear layer learns from the embeddings with their gradient cut: the pair loss alone shapes them
        return pair_loss(e, labels, self.cfg.balance_pairs) + F.cross_entropy(self.out(self.drop(e.detach())), labels)


register_method("contrastive", ContrastiveConfig,
                "SetFit's objective: the encoder tuned so that cosine similarity tells classes apart, every pair of "
                "a batch in one step, then a logistic regression on the embeddings",
                # lr 5e-5, batches of 32, a floor of 20 steps: chosen on rows of train outside the few-shot
                # samples, not on test (bench/contrastive_dev.py; REPORT.md, "Few labels")
                train_defaults={"lr": 5e-5, "epochs": 1, "batch_size": 32, "patience": 2, "min_steps": 20,
                                "eval_batch_size": 128})(ContrastiveHead)
