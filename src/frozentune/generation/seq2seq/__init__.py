"""Encoder-decoder LMs (BART, T5): prefix-tuning with prefixes for the encoder's self-attention,
the decoder's self-attention and the cross-attention (Li & Liang 2021's summarisation setting),
and the fine-tuning reference, on the same trainer, decoding and saving as the causal-LM prefix.

attention.py: where prefixes enter the model (one attention function; the caches stay plain).
tuner.py: the prefixes, loss, decoding, save / load.
"""
from .attention import KINDS, Seq2SeqError, find_sites
from .tuner import (Seq2SeqFinetuner, Seq2SeqPrefixTuner, greedy_reference, is_seq2seq, load_seq2seq_prefix, mixed, prefixed,
                    seq2seq_generate, seq2seq_loss, shapes_from_config, single)

__all__ = ["KINDS", "Seq2SeqError", "find_sites", "Seq2SeqFinetuner", "Seq2SeqPrefixTuner", "greedy_reference",
           "is_seq2seq", "load_seq2seq_prefix", "mixed", "prefixed", "seq2seq_generate", "seq2seq_loss", "shapes_from_config",
           "single"]
