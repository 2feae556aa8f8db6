"""Built-in methods: importing a module registers it."""
from . import probe  # noqa: F401
