"""frozentune: adapt pre-trained language models without retraining them."""
from .errors import FrozentuneError

__version__ = "0.1.0"
__all__ = ["FrozentuneError", "__version__"]
