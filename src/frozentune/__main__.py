"""`python -m frozentune ...`: the same as the `frozentune` command (the server starts itself again
this way to preload an allocator: serve/allocator.py)."""
from .cli import main

raise SystemExit(main())
