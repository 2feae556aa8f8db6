"""`conv`: a convolutional (or Transformer) encoder of its own — LightConv, DynamicConv, dilated
convolutions or self-attention, see frozentune.conv — with mean pooling and a linear layer,
trained end to end from scratch or from a `frozentune pretrain` checkpoint (`--init DIR`).

The method brings its own encoder instead of reading a pre-trained backbone: `build_encoder`
(registered as the method's `encoder`) makes it from the options, presented as a Backbone
(`ConvBackbone`: MiniLM tokenizer, encode(ids, mask), dim, weights hash), and the shared
Classifier trains it like an unfrozen backbone. The saved model holds every encoder weight, so
loading it rebuilds the encoder from the saved options without needing the --init checkpoint.

Legend: B batch, T tokens, D encoder width, C classes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor, nn

from ..backbone import Backbone, LayerSpec, tokenizer_hash
from ..conv.encoder import TOKENIZER, ConvError, Encoder, EncoderConfig, EncoderShape, load_tokenizer
from ..conv.pretrain import as_flags, read_checkpoint
from ..head import Features, Head, Output, masked_mean
from ..registry import MethodConfig, MethodError, register_method
from ..rng import own_rng


@dataclass
class ConvConfig(EncoderShape, MethodConfig):
    init: str = field(default="", metadata={
        "help": "a `frozentune pretrain` output (or step) folder to start the encoder from; empty: random "
                "initialisation. The encoder options must be the checkpoint's"})
    train_backbone: bool = field(default=True, metadata={
        "help": "always on: the encoder is trained with the head"})

    def validate(self) -> None:
        super().validate()
        if not self.train_backbone:
            raise ValueError("conv trains its encoder with the head; --no-train-backbone does not apply "
                             "(a frozen random encoder would learn nothing)")


class ConvBackbone(Backbone):
    """An `Encoder` presented as a Backbone, so the Classifier, trainer, sources, save and load
    treat it like an unfrozen one: tokenize (MiniLM WordPiece, truncated to max_length), pad_id,
    encode(ids, mask) → (B, T, D), dim, weights_hash."""

    def __init__(self, encoder: Encoder, tok, max_length: int, method: str = "conv", init_length: int | None = None):
        if max_length > encoder.config.max_length:
            raise ConvError(f"max_length {max_length} exceeds the encoder's position table ({encoder.config.max_length})")
        super().__init__(f"conv-{encoder.config.arch}", encoder, tok, LayerSpec(), max_length)
        self.encoder_of = method
        self.init_length = init_length

    @property
    def dim(self) -> int:
        return self.model.config.dim

    @property
    def longest_input(self) -> int | None:
        """The positions of the --init checkpoint (a longer --max-length is refused); None from scratch, where
        --max-length sets the position table and nothing else limits it. (The Backbone's answer was the
        MiniLM tokenizer's 512, which this encoder has nothing to do with.)"""
        return self.init_length

    def encode(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """token_type_ids: the MiniLM tokenizer's for a pair (0 first text, 1 second): the segments."""
        return self.model(input_ids, attention_mask.bool(), token_type_ids)


def build_encoder(cfg: ConvConfig, max_length: int, seed: int = 0, load_init: bool = True) -> ConvBackbone:
    """The method's encoder: random (seeded), or with the weights of the --init checkpoint (whose
    position table is cut to max_length). `load_init=False` skips reading the checkpoint (a saved
    model supplies every weight itself)."""
    tok = load_tokenizer()
    enc_cfg = EncoderConfig(**dataclasses.asdict(cfg.shape()), max_length=max_length)
    with own_rng(seed):  # seeded, and the caller's random state left as it was
        encoder = Encoder(enc_cfg, len(tok))
    init_length = load_pretrained(encoder, Path(cfg.init), tok) if cfg.init and load_init else None
    return ConvBackbone(encoder, tok, max_length, init_length=init_length)


def load_pretrained(encoder: Encoder, path: Path, tok) -> int:
    """Copy the encoder weights of a pre-training checkpoint into `encoder`; the architecture,
    tokenizer and (at least) the length must match, and an error says which option to change.
    Returns the checkpoint's length (its positions)."""
    config, state = read_checkpoint(path)
    saved, mine = EncoderConfig(**config["encoder"]), encoder.config
    differ = [f for f in saved.shape_fields() if getattr(saved, f) != getattr(mine, f)]
    if differ:
        shown = ", ".join(f"{f} {getattr(mine, f)} (checkpoint: {getattr(saved, f)})" for f in differ)
        raise ConvError(f"--init {path} was pre-trained as `{as_flags({f: getattr(saved, f) for f in saved.shape_fields()})}`, "
                        f"but the options given differ: {shown}. Pass the checkpoint's options to fine-tune it")
    if config.get("tokenizer_hash") != tokenizer_hash(tok):
        raise ConvError(f"--init {path} was pre-trained with another tokenizer than the {TOKENIZER} one installed "
                        f"here; pre-train again with this one")
    if mine.max_length > saved.max_length:
        raise ConvError(f"--init {path} has positions for {saved.max_length} tokens; fine-tune with "
                        f"--max-length {saved.max_length} or less, or pre-train with a longer --max-length")
    weights = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    weights["pos.weight"] = weights["pos.weight"][:mine.max_length]
    encoder.load_state_dict(weights)
    return saved.max_length


@register_method("conv", ConvConfig,
                 "its own conv (light, dynamic, dilated) or Transformer encoder + mean pooling + linear layer, "
                 "trained end to end from scratch or from a `frozentune pretrain` checkpoint (--init)",
                 train_defaults={"lr": 5e-4, "epochs": 5, "batch_size": 32, "patience": 2},
                 encoder=build_encoder)
class ConvHead(Head):
    """Linear layer on the mean of the encoder's states over real tokens."""

    def __init__(self, cfg: ConvConfig, dim: int, num_labels: int):
        super().__init__()
        self.cfg = cfg
        self.out = nn.Linear(dim, num_labels)

    def init_from_backbone(self, backbone: Backbone, label_names: list[str]) -> None:
        """Refuse an encoder built from other options than this head's (their saved options would lie)."""
        built = backbone.model.config.shape()
        if built != self.cfg.shape():
            raise MethodError(f"conv: the encoder was built with {built}, but the options are {self.cfg.shape()}; "
                              f"build the encoder from the same options")

    def forward(self, f: Features) -> Output:
        return Output(self.out(masked_mean(f.hidden, f.mask)))  # (B, C)
