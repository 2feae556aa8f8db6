"""Write REPORT.md's "Bad input" section from what the bad-input tests saw.

    python bench/bad_input_table.py            # run the tests, rewrite the section
    python bench/bad_input_table.py --check    # run them, fail if the section differs
    FROZENTUNE_BAD_INPUT_LOG=/tmp/rows.jsonl make test
    python bench/bad_input_table.py --check --log /tmp/rows.jsonl  # what that run recorded (CI: no second run)

The tests call the CLI through tests/clirun.py, which appends {row, test, argv, exit code,
message} to $FROZENTUNE_BAD_INPUT_LOG for every case. This script runs those test files with
that variable set, then lays the records out under the issue's table rows, in its order. A row
without a recorded case, or a record under a row that is not in the table, is an error: the
table cannot claim a case no test ran.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "REPORT.md"
START, END = "<!-- bad-input:start -->", "<!-- bad-input:end -->"
TEST_FILES = ["tests/test_bad_input.py", "tests/test_backbone_input.py", "tests/test_cache_integrity.py",
              "tests/test_seq2seq_cli.py",
              "tests/test_interrupts.py", "tests/test_safe_loading.py", "tests/test_relabel.py",
              "tests/test_compare.py", "tests/test_calibrate.py"]

# (row as the issue words it, what must happen); the order of the table
ROWS = [
    ("JSONL with a malformed line (line 1,234 of 5,000)", "names the file and line; nothing cached"),
    ("CSV/TSV with a ragged row, a BOM, CRLF line ends, quoted newlines",
     "BOM/CRLF/quoted newlines read correctly; the ragged row named"),
    ("--text-field/--label-field not present", "lists the columns that are present"),
    ("empty text, whitespace-only text, null text or label",
     "an error naming the first line and how many rows share the problem (decided: not skipped)"),
    ("a text of 2,000,000 characters", "truncated to --max-length tokens without tokenizing it whole; said in the notes"),
    ("non-UTF-8 bytes (Latin-1 file)", "names file and byte offset; says how to convert it"),
    ('labels: one class only; a test label unseen in train; ints vs strings mixed (1 and "1")',
     "clear error / one class per number however it is spelled"),
    ("--backbone that is not a folder, not an id, or a folder without weights; a decoder-only LM given to a "
     "classification method", "names what was expected"),
    ("--layer 99, --layer -9, --layer a", "names the valid range for that backbone"),
    ("--epochs 0, --lr -1, --batch-size 0, an option of another method", "clear error, before any work"),
    ("a cache entry truncated, a shard file deleted, meta.json edited",
     "detected (size/checksum); an error naming the entry and --rebuild-cache"),
    ("Ctrl-C (SIGINT) and SIGTERM during frozentune cache imdb and during train",
     "one line, exit 130 / 143; no .partial-* left; rerunning finishes"),
    ("two frozentune cache of the same entry at the same time", "both end with the same correct entry"),
    ("train --output into a folder that holds another model; into a file; into a read-only folder",
     "refuses to overwrite unless --overwrite; clear errors"),
    ("a saved model whose model.safetensors is corrupt, whose config.json names an unknown method, whose weights "
     "hash does not match", "refuses to load, says which"),
    ("eval --data a dataset whose labels differ from the model's", "names the missing/extra labels"),
    ("predict --input an empty file, a missing file, a directory", "clear error"),
    ("generate on a classification model, explain on a method without explanations",
     "says which commands that model supports"),
    ("labels 1 and 1.0 in one file; a number where text belongs", "one class / a message that says what was found"),
    ("a cache entry whose files were replaced by another entry's; dim or dtype edited in meta.json",
     "key, count and shape checked against what was asked; a clear error"),
    ("a saved model whose weights were overwritten in place, same size",
     "checksum verified at load; NaN never printed as an answer"),
    ("--output that is a file, a read-only folder or an existing model", "checked before any work starts"),
    ("--backbone with a Hugging Face id that contains /; hub unreachable",
     "the id is tried on the hub; offline, one line and a fast failure"),
    ("a pickle that would run code, in place of any file frozentune loads (section 3)",
     "refused in one line; the code never runs (the test's payload would write a marker file)"),
    ("a model folder that ships Python code (auto_map), without --trust-remote-code (section 3)",
     "refused in one line; runs only with the flag"),
    ("source → target pairs (issue 19): a field the file lacks, an empty source, a classifier method on pairs "
     "data, an encoder-decoder prefix exported to PEFT",
     "names the missing field and --source-field / --target-field; says what the data is for; says why"),
    # after the table: found by a new-user walkthrough (2026-11-25)
    ("a lone UTF-16 surrogate in a text (JSON's \\ud800; shell bytes that are not UTF-8)",
     "names file, line, field and character offset (the server: 422); was a traceback / a 500"),
    ("a blank line in the middle of a plain input file or a CSV",
     "names the line(s): dropping it would shift every later row; blank lines at the end are fine"),
    # found by a walk-through of generation (2026-11-27)
    ("--model given twice (argparse kept the last; the first was dropped without a word)",
     "refused, naming both values"),
    # found by a walk-through of concurrent processes (2026-11-28)
    ("two runs (train, sweep, pretrain) given one --output at the same time (one threw its model away at the end; "
     "with --overwrite, one replaced the other's unseen)", "the second is refused at its start, naming the first"),
    # since a load refuses a config.json whose labels were edited (2026-11-29), renames go through `relabel`
    ("relabel: a label the model lacks, OLD without =NEW, two labels given one name, an empty name, a folder "
     "edited by hand, damaged, holding other files or not a classifier; eval on data with the names it was "
     "trained with",
     "each named, the folder left byte for byte as it was; eval says how to rename back"),
    # `frozentune compare` (2026-11-29): a comparison on other examples than the user thinks would mislead
    ("compare: one model, a folder given twice, a missing folder, a text generator, models whose carved test "
     "splits are other rows",
     "each refused in one line before any scoring; other rows named, with --split all or a test file as the way"),
    # `frozentune calibrate` (2026-11-29): a temperature fitted to the examples the model learned would mislead
    ("calibrate: the examples the model was trained on, a split of fewer than 100 examples, a text generator, "
     "--overwrite without --output",
     "each refused in one line, the folder left byte for byte as it was"),
]


def shorten(text: str) -> str:
    """Temporary paths of the test run → `…/name` (they differ every run)."""
    # a folder of tmp_path_factory.mktemp named last: its number is how many of that name the process made before
    # (test files share a worker's base folder under xdist, in another order each run): tiny_llama0 or tiny_llama1
    text = re.sub(r"/tmp/pytest-of-[^/\s]+/pytest-\d+/(popen-gw\d+/)?([^/\s'\"]*?)\d+(?=['\"\s]|$)", r"…/\2", text)
    text = re.sub(r"/tmp/pytest-of-[^/\s]+/pytest-\d+/(popen-gw\d+/)?[^/\s]+/", "…/", text)  # xdist adds popen-gwN/
    text = re.sub(r"/tmp/[^\s'\"]*/", "…/", text)
    text = re.sub(r"\(\d+\.\ds, [\d,]+ tok/s\)", "(…s, … tok/s)", text)  # timings differ every run
    text = re.sub(r"\bprocess \d+\b", "process N", text)  # so do process ids (a lock's holder)
    # a cache entry's name hashes the precision of the pass, whose default is per CPU (bf16 where it has AVX-512
    # BF16, fp32 elsewhere): the same test names another entry on another machine of the same kind
    text = re.sub(r"(cache/)[0-9a-f]{32}\b", r"\1KEY", text)
    return text.replace(str(ROOT) + "/", "")


def run_tests(log: Path) -> None:
    env = {**os.environ, "FROZENTUNE_BAD_INPUT_LOG": str(log)}
    files = [f for f in TEST_FILES if (ROOT / f).is_file()]
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files], cwd=ROOT, env=env)
    if got.returncode != 0:
        sys.exit(f"the bad-input tests failed (exit {got.returncode}); fix them before writing the table")


def of_test_files(records: list[dict]) -> list[dict]:
    """The records of TEST_FILES, in the order a run of those files alone writes them (file by file, as listed;
    a whole-suite run goes through the files in another order, and other files record rows too)."""
    order = {f: i for i, f in enumerate(TEST_FILES)}
    mine = [(order[r["test"].split("::")[0]], i, r) for i, r in enumerate(records) if r["test"].split("::")[0] in order]
    return [r for _, _, r in sorted(mine, key=lambda x: x[:2])]


def section(records: list[dict]) -> str:
    known = {row for row, _ in ROWS}
    stray = sorted({r["row"] for r in records} - known)
    if stray:
        sys.exit(f"records under rows that are not in the table: {stray}")
    lines = [START, "## Bad input (issue 15)", "",
             "Every row of the issue's table, with the answer each case now gives. Generated by "
             "`python bench/bad_input_table.py` from the records the tests in "
             + ", ".join(f"`{f}`" for f in TEST_FILES)
             + " write through `tests/clirun.py` (the exit status and the line the user sees, temporary paths "
             "shortened to `…/`). Every case also checks: no traceback, one error line, nothing half-written "
             "left, the user's files untouched. Exit 2: a usage or data error; 0: handled and done; 130 / 143: "
             "interrupted by SIGINT / SIGTERM.", "",
             "| input | expected | test | exit | what the user sees |", "|---|---|---|---|---|"]
    missing = []
    for row, expected in ROWS:
        mine = [r for r in records if r["row"] == row]
        if not mine:
            missing.append(row)
            continue
        seen, first = set(), True
        for r in mine:
            key = (r["test"].split("::")[-1].split("[")[0], r["code"], shorten(r["message"]))
            if key in seen:
                continue
            seen.add(key)
            cell = lambda s: s.replace("|", "\\|")  # noqa: E731
            lines.append(f"| {cell(row) if first else ''} | {cell(expected) if first else ''} | `{key[0]}` | {key[1]} | "
                         f"{cell(key[2]) or '(no message: exit ' + str(key[1]) + ')'} |")
            first = False
    if missing:
        sys.exit("table rows no test recorded: " + "; ".join(missing))
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if REPORT.md's section differs from a fresh run")
    ap.add_argument("--log", type=Path, help="the records a test run already wrote (FROZENTUNE_BAD_INPUT_LOG=LOG "
                    "make test), instead of running the test files again")
    a = ap.parse_args()
    if a.log is not None:
        if not a.log.is_file():
            sys.exit(f"--log {a.log}: no such file; run the tests with FROZENTUNE_BAD_INPUT_LOG={a.log} first")
        records = [json.loads(line) for line in a.log.read_text().splitlines()]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "records.jsonl"
            run_tests(log)
            records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    new = section(of_test_files(records))
    report = REPORT.read_text()
    if START in report:
        head, rest = report.split(START, 1)
        updated = head + new + rest.split(END, 1)[1]
    else:
        updated = report.rstrip("\n") + "\n\n" + new + "\n"
    if a.check:
        if updated != report:
            sys.exit("REPORT.md's Bad input section differs from what the tests print now: rerun "
                     "python bench/bad_input_table.py")
        print("REPORT.md's Bad input section matches the tests")
        return
    REPORT.write_text(updated)
    print(f"wrote the Bad input section ({len(records)} cases) to {REPORT}")


if __name__ == "__main__":
    main()
