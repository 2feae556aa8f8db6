"""The one base class of the errors frozentune raises about its input, its files or its environment.

Each error says what was wrong and what to do. They keep their older bases (ValueError, RuntimeError),
so existing ``except ValueError`` code still catches them; new code can catch them all with
``except frozentune.FrozentuneError``. The command line prints any of them as one line and exits 2.
"""


class FrozentuneError(Exception):
    """Raised by frozentune for a bad input, file or environment; the message says what to do."""


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is an allocation that failed: numpy's MemoryError, CUDA's OutOfMemoryError, or torch's
    CPU allocator ("can't allocate memory" / "Cannot allocate memory")."""
    said = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or (isinstance(e, RuntimeError) and ("can't allocate memory" in said or "Cannot allocate memory" in said)))
