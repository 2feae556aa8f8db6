"""What a caller of the Python API is told for common mistakes: each call below is made, and the error's type and
message printed as a Markdown table (bench/REPORT.md). Every call fails before any training or backbone pass;
the data folder is $FROZENTUNE_DATA (../shared/data) and the backbone MiniLM, as shipped.

    OMP_NUM_THREADS=1 python bench/python_errors.py [--out bench/results/python_errors.md]
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from frozentune import FrozentuneError, api
from frozentune.generation.run import evaluate_generation, train_generation
from frozentune.serve.engine import Engine, ServeOptions
from frozentune.sweep import Grid


def calls(data: Path, tmp: Path) -> list[tuple[str, object]]:
    sst2, e2e = str(data / "sst2"), str(data / "e2e")
    n = iter(range(100))

    def quiet() -> dict:  # each call its own output folder, so that no call is refused for another's
        return {"log": None, "output": tmp / f"m{next(n)}"}

    return [
        ('api.train("probe", sst2, shots=-1)', lambda: api.train("probe", sst2, shots=-1, **quiet())),
        ('api.train("probe", sst2, shots=8, max_train=100)', lambda: api.train("probe", sst2, shots=8, max_train=100, **quiet())),
        ('api.train("probe", sst2, train_cfg={"lr": -1})', lambda: api.train("probe", sst2, train_cfg={"lr": -1}, **quiet())),
        ('api.train("probe", sst2, shots=8, train_cfg={"cv_folds": -1})',
         lambda: api.train("probe", sst2, shots=8, train_cfg={"cv_folds": -1}, **quiet())),
        ('api.train("probe", sst2, text_field="sentence")', lambda: api.train("probe", sst2, text_field="sentence", **quiet())),
        ('api.train("probe", sst2, pair_field="text")', lambda: api.train("probe", sst2, pair_field="text", **quiet())),
        ('api.train("probe", sst2, BackboneOptions(precision="int8", device="meta"))',
         lambda: api.train("probe", sst2, api.BackboneOptions(precision="int8", device="meta"), **quiet())),
        ('api.train("conv", sst2, BackboneOptions(layers="-2"))',
         lambda: api.train("conv", sst2, api.BackboneOptions(layers="-2"), **quiet())),
        ('api.predict(folder_without_model, ["hi"])', lambda: api.predict(tmp, ["hi"], log=None)),
        ('api.predict(folder_without_model, ["hi"], precision="int4")',
         lambda: api.predict(tmp, ["hi"], precision="int4", log=None)),
        ('Grid.parse("probe,finetune")', lambda: Grid.parse("probe,finetune")),
        ('train_generation("prefix", e2e, train_cfg={"epochs": 0})',
         lambda: train_generation("prefix", e2e, train_cfg={"epochs": 0}, **quiet())),
        ('evaluate_generation(folder_without_model, e2e, num_beams=0)',
         lambda: evaluate_generation(tmp, e2e, num_beams=0, log=None)),
        ('Engine.load([folder], options=ServeOptions(max_wait_ms=-1.0))',
         lambda: Engine.load([tmp], options=ServeOptions(max_wait_ms=-1.0), log=lambda s: None)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the table here")
    a = ap.parse_args()
    data = Path(os.environ.get("FROZENTUNE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    rows = ["| call | error | message |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as t:
        for shown, call in calls(data, Path(t)):
            try:
                call()
                said, kind = "(no error)", ""
            except FrozentuneError as e:
                said, kind = str(e).replace(t, "TMP"), type(e).__name__
            cell = said.replace("|", "\\|")
            rows.append(f"| `{shown}` | {kind} | {cell} |")
    table = "\n".join(rows) + "\n"
    print(table, end="")
    if a.out:
        a.out.write_text(table)


if __name__ == "__main__":
    main()
