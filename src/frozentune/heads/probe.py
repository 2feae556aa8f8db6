"""Baselines: `probe`, a linear layer on pooled frozen states, and `finetune`, the same head
with the backbone unfrozen and trained end to end (run live).

Legend: B batch, T tokens, D hidden, C classes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from ..generation.run import ByArchitecture, LMFinetuner
from ..generation.seq2seq import Seq2SeqFinetuner
from ..head import Features, Head, Output, masked_mean
from ..registry import MethodConfig, changed, register_method


@dataclass
class ProbeConfig(MethodConfig):
    pooling: str = field(default="mean", metadata={
        "help": "how token states become one vector: mean over real tokens, or the first ([CLS]) token",
        "choices": ("mean", "cls")})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the pooled vector", "fraction": True})


@dataclass
class FinetuneConfig(ProbeConfig):
    dropout: float = field(default=0.0, metadata={
        "help": "dropout on the pooled vector; the backbone keeps its own (MiniLM: 0.1), set in its config.json",
        "fraction": True})
    train_backbone: bool = field(default=True, metadata={
        "help": "train the backbone with the head (the point of this baseline)"})
    top_layers: int = field(default=0, metadata={
        "help": "train only the top k layers of the backbone (0: all of it); also for generation (E2E, WebNLG)"})

    def unused(self) -> list[tuple[list[str], str]]:
        return [(changed(self, "top_layers") if not self.train_backbone else [],
                 "chooses which of the backbone's layers train: with --no-train-backbone none does; leave it out")]

    def unused_generating(self) -> list[tuple[list[str], str]]:
        """Generation fine-tunes the LM itself (all of it or --top-layers): the classifier's pooling, dropout
        and frozen backbone do not exist there (it trained the whole LM under --no-train-backbone)."""
        return [(changed(self, "train_backbone", "pooling", "dropout"),
                 "are a classification head's options; a generation run trains the LM itself (all of it, or "
                 "--top-layers): leave them out")]

    def validate(self) -> None:
        if self.top_layers < 0:
            raise ValueError(f"finetune: top_layers={self.top_layers}; give 0 (all layers) or a positive count")


class LinearHead(Head):
    """Linear layer on the pooled token states."""

    def __init__(self, cfg: ProbeConfig, dim: int, num_labels: int):
        super().__init__()
        self.cfg = cfg
        # logits linear in the weights: cross-entropy is convex, so few-label runs solve it exactly
        # (crossval.fit_convex_cv: self.out on convex_inputs); a trained backbone or dropout makes it otherwise
        self.convex = not cfg.train_backbone and cfg.dropout == 0
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(dim, num_labels)

    def convex_inputs(self, f: Features) -> Tensor:
        """(B, D) the pooled vector the linear layer reads: fixed for a convex head, so a solver
        computes it once (crossval.fit_convex)."""
        return masked_mean(f.hidden, f.mask) if self.cfg.pooling == "mean" else f.hidden[:, 0]

    def forward(self, f: Features) -> Output:
        return Output(self.out(self.drop(self.convex_inputs(f))))  # (B, C)


register_method("probe", ProbeConfig, "linear layer on mean-pooled or [CLS] frozen states",
                train_defaults={"lr": 1e-2, "epochs": 20, "batch_size": 64, "patience": 5})(LinearHead)


@register_method("finetune", FinetuneConfig, "the backbone unfrozen with a linear head, trained end to end; "
                 "on generation data the LM itself, causal or encoder-decoder (all or top_layers of it)",
                 train_defaults={"lr": 5e-5, "epochs": 3, "batch_size": 32, "patience": 2},
                 generator=ByArchitecture(LMFinetuner, Seq2SeqFinetuner),
                 generation_defaults={"lr": 5e-5, "epochs": 5, "batch_size": 8, "patience": 2, "eval_batch_size": 32,
                                      "min_steps": 0})  # no step floor in generation: see prefix's registration
class FinetuneHead(LinearHead):
    """Linear head whose backbone is trained too (see `train_backbone`)."""
