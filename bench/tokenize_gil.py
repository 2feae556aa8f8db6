"""One text through MiniLM's tokenizer, the way a server's event loop tokenizes a request, while another
Python thread keeps the interpreter busy (as a server's batcher thread does while it launches a pass):
calls per second of `tok([text], truncation=True, …)` (transformers → the Rust backend's encode_batch,
which releases the GIL), of the backend's `encode_batch` alone and of its `encode` (which keeps the GIL);
then the same with no other thread. (A server tokenizing through `encode` was tried: bench/REPORT.md,
"Tokenizing a request without letting the GIL go".)

    python bench/tokenize_gil.py --out bench/results/tokenize_gil.json
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path


def spin(stop: threading.Event) -> None:
    """Python bytecode until stop is set: a thread that wants the GIL whenever it can have it."""
    n = 0
    while not stop.is_set():
        n += 1


def rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from frozentune.backbone import ALIASES

    tok = AutoTokenizer.from_pretrained(ALIASES["minilm"]())
    backend = tok._tokenizer
    text = "a gorgeous , witty , seductive movie ."
    calls = {"tok([text]) (transformers, encode_batch)": lambda: tok([text], truncation=True, max_length=128, padding=False,
                                                                   return_attention_mask=False, return_token_type_ids=False),
             "backend.encode_batch([text])": lambda: backend.encode_batch([text], add_special_tokens=True),
             "backend.encode(text)": lambda: backend.encode(text, add_special_tokens=True)}
    out = {"text": text, "switch_interval_s": sys.getswitchinterval(), "seconds": a.seconds, "calls_per_s": {}}
    for busy in (True, False):
        stop = threading.Event()
        spinner = threading.Thread(target=spin, args=(stop,), daemon=True)
        if busy:
            spinner.start()
        for name, fn in calls.items():
            fn()
            r = rate(fn, a.seconds)
            out["calls_per_s"].setdefault(name, {})["beside a busy thread" if busy else "alone"] = round(r)
            print(f"{'busy' if busy else 'alone':5s} {name:45s} {r:10,.0f} calls/s", flush=True)
        stop.set()
        if busy:
            spinner.join()
    if a.out:
        out["command"] = "python bench/tokenize_gil.py " + " ".join(sys.argv[1:])
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
