"""Taking a frozentune model where another stack runs it, and bringing one back.

  frozentune export --model DIR --format peft --output OUT     a PEFT prefix-tuning adapter folder
  frozentune import --format peft --adapter DIR --output OUT   a PEFT prefix adapter as a frozentune model
  frozentune export --model DIR [DIR ...] --format onnx --output OUT   classifiers as one ONNX graph

`peft` holds the conversion of prefixes (frozentune's (N, 2, H, P, E) tensor ⇄ PEFT's flat
`prompt_embeddings`); `onnx` the graph of a frozen backbone and its heads, and the ONNX Runtime
path that runs it (`predict --onnx`); `card` writes the README.md model card a saved folder carries so it can be
uploaded to the Hugging Face Hub as it is.
"""
from __future__ import annotations

from ..errors import FrozentuneError


class ExportError(FrozentuneError, ValueError):
    """A model or adapter that cannot be converted; the message says why and what to do."""


FORMATS = ("peft", "onnx")
