"""Built-in methods: importing a module registers it."""
from . import probe, self_explaining, space, ytuning  # noqa: F401
