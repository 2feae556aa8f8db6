"""Built-in methods: importing a module registers it."""
from . import conv, probe, self_explaining, space, ytuning  # noqa: F401
