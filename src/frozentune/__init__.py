"""frozentune: adapt pre-trained language models without retraining them."""
__version__ = "0.1.0"
