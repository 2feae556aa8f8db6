"""Generation on a frozen language model, and the prefixes that steer one: source → target runs
(E2E, WebNLG, any pairs file) on causal and encoder-decoder LMs, decoding and mixed-prefix batches,
and prefix-tuning of a frozen encoder for classification, which shares the prefix machinery.

  run.py             a generation run: the pairs it trains on, the fine-tuning reference method,
                     the shared training and decoding path, the metrics, saved folders
  precision.py       --precision of decoding: a frozen LM's linear layers in bf16/fp16 under autocast
  prefix.py          prefix-tuning a causal LM: the reparameterised prefix, its keys and values at
                     every layer, the loss, greedy and beam decoding, one batch of many prefixes
  seq2seq/           the same for encoder-decoder LMs (BART, T5): the attention sites a prefix enters
  encoder_prefix.py  prefix-tuning a frozen bidirectional encoder (BERT family) as a classification method

The entry points the CLI and the API use are importable from the package itself.
"""
from __future__ import annotations

from .run import (DecodeOptions, evaluate_generation, generate_sources, is_generation_data, is_generation_model,
                  read_sources, train_generation)

__all__ = ["DecodeOptions", "evaluate_generation", "generate_sources", "is_generation_data", "is_generation_model",
           "read_sources", "train_generation"]
