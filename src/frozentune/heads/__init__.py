"""Built-in methods: importing a module registers it."""
from . import probe, ytuning  # noqa: F401
