"""Built-in methods: importing a module registers it."""
from . import contrastive, conv, probe, self_explaining, space, ytuning  # noqa: F401
from ..generation import encoder_prefix  # noqa: F401  (prefix-tuning: generation and encoder classification)
