"""The encoder: token + learned position embeddings, N layers (a mixer block and a FFN, each with a
LayerNorm'd residual branch), a final LayerNorm. The mixer is what the four architectures differ in:

  light        ConvBlock(LightConv)     GLU → softmax kernel shared per head → W^O
  dynamic      ConvBlock(DynamicConv)   GLU → kernel predicted per position → W^O
  dilated      ConvBlock(DilatedConv)   GLU → depthwise kernel, dilation growth^(l mod cycle) → W^O
  transformer  SelfAttention            Q, K, V, O projections

Attention has four d×d projections where a ConvBlock has three (W^I, W^S, W^O), so the
Transformer's FFN is d/2 narrower (2·d·d/2 = d² weights): the four encoders then have parameter
counts within 5% of each other (`parameter_counts`).

Legend: B batch, T tokens, D model width (dim), V vocabulary.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor, nn

from ..errors import FrozentuneError
from ..fields import as_flag
from ..registry import changed
from .layers import ConvBlock, DilatedConv, DynamicConv, EncoderLayer, LightConv, SelfAttention

ARCHS = ("light", "dynamic", "dilated", "transformer")
CONVS = ("light", "dynamic", "dilated")
TOKENIZER = "minilm"  # the MiniLM WordPiece tokenizer (backbone alias), the only one used here


class ConvError(FrozentuneError, ValueError):
    """Bad encoder options, corpus or checkpoint; the message says what to do."""


MIXER_OPTIONS = ("heads", "kernel_size", "dilation_growth", "dilation_cycle", "weight_dropout")
MIXER_READS = {"light": {"heads", "kernel_size", "weight_dropout"}, "dynamic": {"heads", "kernel_size", "weight_dropout"},
               "dilated": {"kernel_size", "dilation_growth", "dilation_cycle"}, "transformer": {"heads"}}  # (make_mixer)


@dataclass
class EncoderShape:
    """What defines an encoder apart from its position table (shared by `pretrain` and the `conv` method)."""
    arch: str = field(default="light", metadata={
        "help": "token mixer: light (LightConv), dynamic (DynamicConv), dilated (dilated depthwise "
                "convolution) or transformer (multi-head self-attention)", "choices": ARCHS})
    layers: int = field(default=4, metadata={"help": "encoder layers"})
    dim: int = field(default=256, metadata={"help": "model width d"})
    heads: int = field(default=4, metadata={"help": "heads H (kernel sharing groups for light/dynamic, attention heads; dilated has none); must divide dim"})
    kernel_size: int = field(default=7, metadata={"help": "convolution width k (odd)"})
    ffn_dim: int = field(default=1024, metadata={
        "help": "feed-forward width (the Transformer's is ffn_dim − dim/2, which pays for attention's fourth d×d projection)"})
    dilation_growth: int = field(default=2, metadata={"help": "dilated: layer l uses dilation growth^(l mod cycle)"})
    dilation_cycle: int = field(default=4, metadata={"help": "dilated: layers after which the dilation restarts at 1"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings, residual branches, FFN and attention"})
    weight_dropout: float = field(default=0.0, metadata={"help": "light/dynamic: dropout on the softmax-normalised kernel"})

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise ConvError(f"--arch {self.arch!r}: choose one of {', '.join(ARCHS)}")
        require_at_least(self, ("layers", "dim", "heads", "ffn_dim"), 1)
        if self.dim % self.heads and "heads" in MIXER_READS[self.arch]:  # the dilated mixer has none (unused() says so)
            raise ConvError(f"--heads {self.heads}: must divide --dim {self.dim}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConvError(f"--kernel-size {self.kernel_size}: give an odd width (the kernel is centred)")
        require_at_least(self, ("dilation_growth", "dilation_cycle"), 1)
        if self.arch == "transformer" and ffn_width(self) < 1:
            raise ConvError(f"--ffn-dim {self.ffn_dim}: the Transformer's FFN is ffn_dim − dim/2 wide; give "
                            f"--ffn-dim {self.dim // 2 + 1} or more")
        for name in ("dropout", "weight_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConvError(f"{as_flag(name)} {getattr(self, name)}: give a value in [0, 1)")

    def unused(self) -> list[tuple[list[str], str]]:
        """Options of other mixers than --arch's (heads, kernel width, dilation, kernel dropout)."""
        extra = changed(self, *(n for n in MIXER_OPTIONS if n not in MIXER_READS[self.arch]))
        one = len(extra) == 1
        return [(extra, f"{'does' if one else 'do'} not apply to --arch {self.arch}; leave {'it' if one else 'them'} out")]

    def shape(self) -> "EncoderShape":
        """Just these fields (of a subclass such as EncoderConfig or the conv method's config)."""
        return EncoderShape(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EncoderShape)})

    def shape_fields(self) -> tuple[str, ...]:
        """The fields that decide the weights' meaning for this arch (a checkpoint must match them)."""
        fields = ("arch", "layers", "dim", "heads", "ffn_dim")
        if self.arch in CONVS:
            fields += ("kernel_size",)
        if self.arch == "dilated":
            fields += ("dilation_growth", "dilation_cycle")
        return fields


@dataclass
class EncoderConfig(EncoderShape):
    max_length: int = field(default=128, metadata={"help": "rows of the learned position table: the longest input in tokens"})

    def validate(self) -> None:
        super().validate()
        require_at_least(self, ("max_length",), 2, " ([CLS] and [SEP])")


def require_at_least(cfg: object, names: tuple[str, ...], least: int, why: str = "") -> None:
    """A ConvError naming the first of `cfg`'s fields `names` below `least`, as the command line spells it
    ("--batch-size 0: must be at least 1")."""
    for name in names:
        if (value := getattr(cfg, name)) < least:
            raise ConvError(f"{as_flag(name)} {value}: must be at least {least}{why}")


def ffn_width(s: EncoderShape) -> int:
    return s.ffn_dim - s.dim // 2 if s.arch == "transformer" else s.ffn_dim


def dilation(s: EncoderShape, layer: int) -> int:
    return s.dilation_growth ** (layer % s.dilation_cycle)


def receptive_radius(s: EncoderShape) -> int | None:
    """How far (in positions, each side) a token can influence outputs; None = everywhere."""
    if s.arch == "transformer":
        return None
    per_layer = [dilation(s, i) if s.arch == "dilated" else 1 for i in range(s.layers)]
    return (s.kernel_size // 2) * sum(per_layer)


def make_mixer(s: EncoderShape, layer: int) -> nn.Module:
    if s.arch == "transformer":
        return SelfAttention(s.dim, s.heads, s.dropout)
    if s.arch == "light":
        conv: nn.Module = LightConv(s.dim, s.heads, s.kernel_size, s.weight_dropout)
    elif s.arch == "dynamic":
        conv = DynamicConv(s.dim, s.heads, s.kernel_size, s.weight_dropout)
    else:
        conv = DilatedConv(s.dim, s.kernel_size, dilation(s, layer))
    return ConvBlock(s.dim, conv)


class Encoder(nn.Module):
    """ids (B, T), mask (B, T) bool (and segments (B, T): 0 on a pair's first text, 1 on its
    second) → token states (B, T, D).

    The segment embedding starts at zero, so it changes nothing until trained. Single texts are
    segment 0 throughout (its row 0 then acts as one learnt bias vector, in pre-training too); the
    second text of a pair is segment 1, learnt when the encoder is fine-tuned on pairs. A checkpoint
    or saved model from before it existed loads with it at zero, and computes what it did."""

    def __init__(self, cfg: EncoderConfig, vocab_size: int):
        super().__init__()
        cfg.validate()
        self.config, self.vocab_size = cfg, vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_length, cfg.dim)
        self.seg = nn.Embedding(2, cfg.dim)
        nn.init.zeros_(self.seg.weight)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg.dim, make_mixer(cfg, i), ffn_width(cfg), cfg.dropout)
                                    for i in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # saved before the segment embedding existed: it is zero, as a new encoder's
        state_dict.setdefault(prefix + "seg.weight", torch.zeros_like(self.seg.weight))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, ids: Tensor, mask: Tensor, segments: Tensor | None = None) -> Tensor:
        T = ids.shape[1]
        if T > self.config.max_length:
            raise ConvError(f"{T} tokens, but the position table has {self.config.max_length} rows: "
                            f"truncate inputs to max_length {self.config.max_length}")
        mask = mask.bool()
        seg = self.seg(segments.clamp(0, 1)) if segments is not None else self.seg.weight[0]  # (B, T, D) or (D,)
        x = self.drop(self.tok(ids) + self.pos(torch.arange(T, device=ids.device)) + seg)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


def parameter_counts(shape: EncoderShape | None = None, vocab_size: int = 30522,
                     max_length: int = 128) -> dict[str, dict[str, int]]:
    """For each arch at the given sizes (default: the default shape): total parameters and those
    outside the embeddings. Built on the meta device, so nothing is allocated."""
    shape = shape or EncoderShape()
    out = {}
    for arch in ARCHS:
        cfg = EncoderConfig(**{**dataclasses.asdict(shape), "arch": arch}, max_length=max_length)
        with torch.device("meta"):
            enc = Encoder(cfg, vocab_size)
        total = sum(p.numel() for p in enc.parameters())
        emb = enc.tok.weight.numel() + enc.pos.weight.numel() + enc.seg.weight.numel()
        out[arch] = {"total": total, "non_embedding": total - emb}
    return out


@lru_cache(maxsize=None)
def load_tokenizer():
    """The MiniLM WordPiece tokenizer (fast), from the folder the `minilm` alias resolves to, reading a
    typed "[MASK]" or "[SEP]" as its characters (backbone.text_as_text), as the frozen backbones do: a
    corpus line holding "[MASK]" would otherwise give the mask token as an input no target asks for,
    and a "[SEP]" in a text would split it."""
    from transformers import AutoTokenizer

    from ..backbone import resolve_name, text_as_text

    tok = AutoTokenizer.from_pretrained(resolve_name(TOKENIZER))
    text_as_text(tok)
    return tok
