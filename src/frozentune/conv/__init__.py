"""Convolutional encoders and their Transformer baseline, trained from scratch or pre-trained by
masked language modelling ("Are Pre-trained Convolutions Better than Pre-trained Transformers?",
Tay et al. 2021; LightConv and DynamicConv from Wu et al. 2019).

  layers.py    LightConv, DynamicConv, DilatedConv (each with a slow `reference`), the GLU block,
               self-attention, FFN, the encoder layer
  encoder.py   EncoderShape / EncoderConfig, Encoder, parameter_counts, the MiniLM tokenizer
  pretrain.py  MLM masking, the MLM head, corpus, resumable checkpoints, `pretrain`
The `conv` method (heads/conv.py) fine-tunes an encoder with mean pooling and a linear layer.
"""
from .encoder import ARCHS, ConvError, Encoder, EncoderConfig, EncoderShape, parameter_counts
from .pretrain import PretrainConfig, mask_tokens, pretrain

__all__ = ["ARCHS", "ConvError", "Encoder", "EncoderConfig", "EncoderShape", "PretrainConfig",
           "mask_tokens", "parameter_counts", "pretrain"]
