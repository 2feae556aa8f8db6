"""Datasets: the named ones in ../shared/data and any user's JSONL / CSV / TSV file or folder.

Classification splits are `TextSplit`s (texts, label names, where each came from). Labels are
always names; the order of `Dataset.labels` is the model's output order and is saved with it.

Every error names the file and, where there is one, the line, and says what to do.
"""
from __future__ import annotations

import bisect
import dataclasses
import csv
import decimal
import hashlib
import io
import json
import math
import numbers
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .errors import FrozentuneError
from .pairs import PAIR_FIELDS, Text, is_pair

CLASSIFICATION = {
    # name: canonical label order (used as the model's output order)
    "sst2": ["negative", "positive"],
    "sst5": ["very negative", "negative", "neutral", "positive", "very positive"],
    "trec": ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"],
    "imdb": ["negative", "positive"],
    "snli": ["entailment", "neutral", "contradiction"],
    "rte": ["entailment", "not_entailment"],
    "mrpc": ["not_equivalent", "equivalent"],
}
GENERATION = {"e2e", "webnlg"}
SPLIT_NAMES = ("train", "validation", "test")
SPLIT_ALIASES = {"train": "train", "validation": "validation", "valid": "validation",
                 "dev": "validation", "val": "validation", "test": "test"}
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow")  # .json: JSON Lines, or one array of objects
COMPRESSED = (".gz", ".bz2", ".xz", ".zip", ".zst", ".7z", ".tgz")
ARROW_SUFFIXES = (".parquet", ".arrow")  # read through Hugging Face `datasets` (the `hf` extra)
FORMATS_HELP = ".jsonl, .json, .csv, .tsv, .parquet or .arrow file, a folder of train/validation/test files, a folder " \
               "written by datasets' save_to_disk"


class DataError(FrozentuneError, ValueError):
    """Bad input data: the message names the file (and line) and what to do about it."""


class CarveError(DataError):
    """A split that cannot be carved from the rows given (too few, or a class too small); eval adds what
    to do instead."""


@dataclass
class TextSplit:
    """One split of a classification dataset. `lines[i]` is the 1-based line of example i.

    A text is a string, or for sentence-pair data a (first, second) pair of strings (`pairs.Text`).
    `file_texts` holds every text of the file the split came from and `rows[i]` the position of
    example i in it, so splits carved from one file share one feature-cache entry (changing the
    validation fraction or seed never re-extracts); `file` names that file (recorded in the entry)."""
    texts: list[Text]
    labels: list[str]
    source: str
    lines: list[int]
    file_texts: list[Text] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    label_spellings: dict[str, list[str]] = field(default_factory=dict)  # label → its raw forms in this file
    file: str = ""  # the file file_texts were read from ("" where not known)

    def __post_init__(self) -> None:
        if not self.file_texts:
            self.file_texts = self.texts
            self.rows = np.arange(len(self.texts), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def is_pair(self) -> bool:
        """Whether its texts are sentence pairs."""
        return bool(self.file_texts) and is_pair(self.file_texts[0])

    def subset(self, idx: np.ndarray | list[int], source: str | None = None) -> "TextSplit":
        idx = [int(i) for i in idx]
        return TextSplit([self.texts[i] for i in idx], [self.labels[i] for i in idx],
                         source or self.source, [self.lines[i] for i in idx],
                         self.file_texts, self.rows[idx], file=self.file)


@dataclass
class Dataset:
    """train / validation / test splits plus the label order. `notes` records carved splits."""
    name: str
    train: TextSplit
    validation: TextSplit
    test: TextSplit
    labels: list[str]
    notes: list[str] = field(default_factory=list)
    text_field: str = "text"
    pair_field: str | None = None   # the second text's field, for sentence-pair data
    # how train and validation were made from the files: {"files": {split: path}, "seed", "shots",
    # "max_train", "carve_below"}; load_classification with these gives the same splits again (eval)
    split_rule: dict | None = None
    # validation was carved out of the very rows that train on (not from a larger train later cut by
    # --max-train): there were at least carve_below of them, so the run early-stops on the carve even
    # where train is left with fewer (it does not cross-validate and leave the carve unused)
    carved_from_train: bool = False

    def label_ids(self, split: TextSplit) -> np.ndarray:
        """(N,) int64 label indices; a label training never saw is an error naming its line."""
        index = {name: i for i, name in enumerate(self.labels)}
        return encode_labels(split, index)


def encode_labels(split: TextSplit, index: dict[str, int]) -> np.ndarray:
    out = np.empty(len(split), dtype=np.int64)
    for i, lab in enumerate(split.labels):
        if lab not in index:
            raise DataError(
                f"{split.source}:{split.lines[i]}: label {lab!r} was never seen in training "
                f"(known labels: {some(list(index))}). Fix the label or train on data that has it.")
        out[i] = index[lab]
    return out


def some(labels: Sequence[str], shown: int = 12) -> str:
    """Labels for a message: quoted (so that ' and '' differ), at most `shown` of them and how many more (a list of
    1,000 labels made one 7 KB line)."""
    head = ", ".join(map(repr, labels[:shown]))
    return head + (f", … ({len(labels) - shown:,} more)" if len(labels) > shown else "")


def data_root() -> Path:
    """$FROZENTUNE_DATA, else ../shared/data beside the repository (or the current folder)."""
    env = os.environ.get("FROZENTUNE_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in [Path.cwd(), *here.parents]:
        cand = parent.parent / "shared" / "data"
        if cand.is_dir():
            return cand
    return Path.cwd().parent / "shared" / "data"


# ----------------------------------------------------------------------------- raw records
def json_line(record: object, ascii_only: bool = False) -> str:
    """`record` as one line of JSON Lines, its text as written (not \\u-escaped, unless `ascii_only`: for
    an output that cannot take every character), except the three characters JSON leaves raw that line
    readers split at (U+0085, U+2028, U+2029: Python's str.splitlines, editors, terminals), so that
    line N of the output is record N for every reader."""
    return (json.dumps(record, ensure_ascii=ascii_only, allow_nan=False)
            .replace("\x85", "\\u0085").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


STDIN = Path("<standard input>")
STDIN_RECORDS = (" Records on standard input (--input -) are read as JSON Lines; give a .csv / .tsv file by its "
                 "path.")


def read_records(path: Path, skip_blank: bool = False) -> list[tuple[int, dict]]:
    """All records of a .jsonl/.csv/.tsv file as (line number, dict); of a .parquet / .arrow file
    or a `save_to_disk` folder of one split as (row number from 1, dict). A blank CSV/TSV row with
    rows after it is an error naming its line (rows are never dropped silently), unless `skip_blank`
    (for a caller that drops empty texts anyway, e.g. a pre-training corpus); blank rows at the end
    are ignored. Blank JSONL lines hold no record and are skipped."""
    if str(path) == "-":  # standard input has no suffix to say its format: JSON Lines, the one that needs no header
        return _read_jsonl(STDIN, _read_stdin("records", "JSON objects").encode("utf-8"))
    if is_hf_split_folder(path):
        return read_hf(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file. Give a {FORMATS_HELP}, "
                        f"or a dataset name ({', '.join(sorted(CLASSIFICATION | dict.fromkeys(GENERATION)))}).")
    suffix = path.suffix.lower()
    if suffix == ".json" and _starts_with(path, b"["):
        return _read_json_array(path)
    if suffix == ".jsonl" or suffix == ".json":
        return _read_jsonl(path)
    if suffix in (".csv", ".tsv"):
        return _read_delimited(path, "\t" if suffix == ".tsv" else ",", skip_blank)
    if suffix in ARROW_SUFFIXES:
        return read_hf(path)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json, .csv, .tsv, .parquet or .arrow"
                    + (f" ({compressed_note(path)})." if suffix in COMPRESSED else "."))


def holds_records(path: Path) -> bool:
    """Whether `path` is read as records rather than as lines of text: a data file (.jsonl, .json, .csv,
    .tsv, .parquet, .arrow) that is there, or a `save_to_disk` folder of one split."""
    path = Path(path)
    return (path.suffix.lower() in SUFFIXES and path.is_file()) or is_hf_split_folder(path)


def compressed_note(path: Path) -> str:
    """What to do with a compressed file, which is not read (its bytes are not text)."""
    how = _DECOMPRESS.get(path.suffix.lower(), "unzip")
    return f"a compressed file is not read: decompress it first, e.g. {how} {path.name}"


_DECOMPRESS = {".gz": "gunzip -k", ".tgz": "tar xzf", ".bz2": "bunzip2 -k", ".xz": "unxz -k", ".zst": "unzstd",
               ".7z": "7z x"}


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file's first byte that is not whitespace (or a byte-order mark) is `prefix`."""
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(prefix)


def _read_json_array(path: Path) -> list[tuple[int, dict]]:
    """A .json file holding one array of objects (pandas' `to_json(orient="records")`), as (the
    line its object starts on, dict), so that errors name lines as they do for JSON Lines."""
    text = _decode(path, path.read_bytes())
    dec = json.JSONDecoder()
    pos, out = text.index("[") + 1, []
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]  # where each line starts (\n, \r\n or \r)

    def line_at(i: int) -> int:  # found among the line starts, not by counting the text before i for every object
        return bisect.bisect_right(starts, i)

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    pos = skip(pos)
    while pos < len(text) and text[pos] != "]":
        try:
            rec, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line_at(e.pos)}: not a valid JSON array of objects ({e.msg}).") from None
        except ValueError as e:  # e.g. an integer of more than 4,300 digits
            raise DataError(f"{path}:{line_at(pos)}: not readable as JSON ({e}).") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{line_at(pos)}: expected an object in the array, got {_kind(rec)}. {_OBJECTS}")
        out.append((line_at(pos), rec))
        pos = skip(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip(pos + 1)
        elif pos >= len(text) or text[pos] != "]":
            raise DataError(f"{path}:{line_at(pos)}: not a valid JSON array of objects (expected ',' or ']' after "
                            f"the object on line {out[-1][0]}).")
    if pos >= len(text):
        raise DataError(f"{path}:{line_at(pos)}: not a valid JSON array of objects (no closing ']').")
    if text[pos + 1:].strip():
        raise DataError(f"{path}:{line_at(pos + 1)}: text after the JSON array's closing ']'; a .json file holds one "
                        f"array of objects, or one object per line (JSON Lines).")
    if not out:
        raise DataError(f"{path}: the file has no records (an empty array).")
    return out


def is_hf_split_folder(path: Path) -> bool:
    """Whether `path` is one split written by `Dataset.save_to_disk` (state.json + .arrow files)."""
    return path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def read_hf(path: Path) -> list[tuple[int, dict]]:
    """The rows of a Parquet file, an Arrow file written by `datasets`, or one split saved by
    `save_to_disk`, read with Hugging Face `datasets` (memory-mapped, nothing copied to its cache),
    as (row number from 1, dict). Class-label columns (ClassLabel) come back as their names."""
    import importlib.util

    try:
        import datasets
    except ImportError as e:  # installed but failing to import (pyarrow refusing numpy 1.x) was told to install it
        if importlib.util.find_spec("datasets") is not None:
            raise DataError(f"{path}: Parquet, Arrow and save_to_disk data are read with Hugging Face datasets, which "
                            f"is installed but does not import ({' '.join(str(e).split())[:300]}); fix that "
                            f"installation (e.g. pip install -U 'frozentune[hf]')") from None
        raise DataError(f"{path}: Parquet, Arrow and save_to_disk data are read with Hugging Face datasets: "
                        f"pip install 'frozentune[hf]' (or pip install datasets)") from None
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
        elif path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(str(path))
            ds = datasets.Dataset(table)  # its features (ClassLabel names) come from the file's schema metadata
        else:
            ds = _read_arrow(path)
    except (OSError, ValueError, KeyError) as e:  # pyarrow's errors are OSError / ValueError
        raise DataError(f"{path}: not readable as {'a save_to_disk folder' if path.is_dir() else path.suffix[1:] + ' data'} "
                        f"({' '.join(str(e).split())[:300]}); check the file, or write it again") from None
    if isinstance(ds, datasets.DatasetDict):
        raise DataError(f"{path}: a DatasetDict folder (splits {', '.join(ds)}); give the folder itself as --data, "
                        f"not to --input, or one split's subfolder")
    names = {k: f.names for k, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
    out = []
    for n, row in enumerate(ds, 1):
        for k, labels in names.items():
            v = row.get(k)
            row[k] = labels[v] if isinstance(v, int) and 0 <= v < len(labels) else None  # -1: no label (GLUE test)
        out.append((n, row))
    return out


def _read_arrow(path: Path):
    """An .arrow file as a `datasets.Dataset`: the IPC stream format `datasets` writes, or the IPC
    file format (Feather v2) that pandas' `to_feather` and polars' `write_ipc` write."""
    import datasets
    import pyarrow as pa

    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"ARROW1":  # the file format opens with its magic bytes; the stream format does not
        with pa.memory_map(str(path)) as source:
            return datasets.Dataset(pa.ipc.open_file(source).read_all())
    return datasets.Dataset.from_file(str(path))


def _utf8_error(path: Path, e: UnicodeDecodeError, line: int, offset: int) -> DataError:
    """A decoding error as one line: the file, the line, the byte offset in the file and the way out
    (from UTF-16 where the file opens with its byte-order mark, else from Latin-1 as the likeliest)."""
    bad = e.object[e.start:e.start + 1].hex() if isinstance(e.object, bytes) else "?"
    with open(path, "rb") as f:
        head = f.read(2)
    utf16 = head in (b"\xff\xfe", b"\xfe\xff")
    source = "UTF-16" if utf16 else "latin1"
    return DataError(f"{path}:{line}: not UTF-8 text (byte 0x{bad} at byte offset {offset:,}"
                     + ("; the file is UTF-16: it opens with UTF-16's byte-order mark" if utf16 else "")
                     + f"). Save the file as UTF-8, e.g. iconv -f {source} -t utf-8 {path.name} > "
                     f"{path.stem}.utf8{path.suffix}")


def _decode(path: Path, data: bytes) -> str:
    """A whole file's bytes as text (a byte-order mark dropped), or a DataError naming the line and
    the byte offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e, data.count(b"\n", 0, e.start) + 1, e.start) from None


def _read_jsonl(path: Path, data: bytes | None = None) -> list[tuple[int, dict]]:
    """The records of a JSON Lines file, or of its bytes `data` already read (standard input)."""
    out = []
    offset = 0  # of the line in the file
    with open(path, "rb") if data is None else io.BytesIO(data) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise _utf8_error(path, e, n, offset + e.start) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON Lines ({_json_line_problem(line, e)}). "
                                f"Each line must be one JSON object." + STDIN_RECORDS * (path == STDIN)) from None
            except ValueError as e:  # e.g. an integer of more than 4,300 digits
                raise DataError(f"{path}:{n}: not readable as JSON ({e}).") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{n}: expected a JSON object per line, got {_kind(rec)}. {_OBJECTS}")
            out.append((n, rec))
    if not out:
        raise DataError(f"{path}: " + ("no records were piped in; give one JSON object per line" if path == STDIN
                                       else "the file has no records."))
    return out


def _json_line_problem(line: str, e: json.JSONDecodeError) -> str:
    """json's reason a line is not JSON, in the terms of a line of a JSON Lines file. A line that ends before its
    object does was said as "Expecting ',' delimiter: column 1" (the column after the line break) or "Invalid
    control character": it was cut short, or a text in it holds a raw line break, which ends the line."""
    body = line.rstrip("\r\n")
    if e.pos >= len(body.rstrip()) or e.msg.startswith("Unterminated string"):
        return (f"the line ends inside its JSON object, after column {len(body)}: cut short, or a text in it holds a "
                f"raw line break, to be written \\n")
    if e.msg.startswith("Invalid control character"):
        return (f"a raw control character U+{ord(line[e.pos]):04X} inside a string at column {e.colno}, to be written "
                f"escaped (\\t for a tab)")
    return f"{e.msg}: column {e.colno}"


def _blank_lines_error(path: Path, blank: list[int], what: str, way_out: str) -> DataError:
    """The error for blank lines (`blank`, 1-based) with `what` (rows, texts) after them."""
    shown = ", ".join(map(str, blank[:5])) + (", ..." if len(blank) > 5 else "")
    many = f"{len(blank):,} blank lines with {what} after them (lines {shown})" if len(blank) > 1 \
        else f"a blank line with {what} after it"
    return DataError(f"{path}:{blank[0]}: {many}; rows are never skipped silently (blank lines at the end "
                     f"are fine): {way_out}")


def _read_delimited(path: Path, delimiter: str, skip_blank: bool = False) -> list[tuple[int, dict]]:
    kind = "TSV" if delimiter == "\t" else "CSV"
    out = []
    blank: list[int] = []  # blank lines not yet followed by a row
    # decoded whole (so that a byte that is not UTF-8 is named with its line); newline="" lets csv read
    # CRLF and quoted newlines. Fields may be as long as a text can be (csv's default limit is 131,072
    # characters, and a review longer than that is cut at --max-length like any other)
    csv.field_size_limit(min(sys.maxsize, 2 ** 31 - 1))
    with io.StringIO(_decode(path, path.read_bytes()), newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        try:
            header = next(reader, None)
            if not header:
                raise DataError(f"{path}: empty {kind} file; the first row must name the columns.")
            unnamed = [i + 1 for i, h in enumerate(header) if not h.strip()]
            if len(unnamed) > 1:  # e.g. empty columns a spreadsheet left at the end of every row (trailing commas)
                raise DataError(f"{path}:1: the header leaves {len(unnamed)} columns unnamed (columns "
                                f"{', '.join(map(str, unnamed))} of {len(header)}), so they cannot be told apart; "
                                f"name them, or delete them (a spreadsheet's empty columns: trailing delimiters)")
            twice = sorted({h for h in header if header.count(h) > 1})
            if twice:
                raise DataError(f"{path}:1: the header names {', '.join(map(repr, twice))} more than once, so a "
                                f"column cannot be chosen by name; rename the columns so that each name is used once.")
            end = reader.line_num
            seen: list[set[str]] = [set() for _ in header]  # each column's first _FEW + 1 values (a label column's few)
            for row in reader:
                n, start, end = reader.line_num, end + 1, reader.line_num
                if n > start and (swallowed := _swallowed(row, delimiter, len(header), seen)):
                    raise DataError(f"{path}:{start}: a field that starts with a quote (\") runs on to line {n}, taking "
                                    f"in {swallowed} line(s) shaped like rows of this file: {n - start + 1} lines read as "
                                    f"one row. Where a quote is part of the text, write the field in quotes with the "
                                    f"quote doubled (\"\"), or save the data as .jsonl")
                if row == header and out:  # two files joined: the header again, which would be a row (a class 'label')
                    raise DataError(f"{path}:{start}: the header again ({delimiter.join(header)!r}), read as a row; "
                                    f"files joined with their headers? Remove the line")
                if not row:
                    blank.append(n)
                    continue
                if blank and not skip_blank:
                    raise _blank_lines_error(path, blank, "rows", "remove them, or fill them in")
                if len(row) != len(header):
                    raise DataError(f"{path}:{start}: not valid {kind}: {len(row)} fields where the "
                                    f"header has {len(header)} ({', '.join(header)}). Quote fields "
                                    f"that contain the delimiter.")
                out.append((start, dict(zip(header, row))))  # numbered by its first line (a quoted field may span several)
                for col, value in zip(seen, row):
                    if len(col) <= _FEW:
                        col.add(value)
        except csv.Error as e:
            start = end + 1  # the row being read starts there; a quote opened in it can run to the end of the file
            more = (f" (the row starting on line {start} reads on to line {reader.line_num}: is a quote in it never "
                    f"closed?)" if reader.line_num > start else "")
            raise DataError(f"{path}:{start}: not valid {kind}: {e}{more}.") from None
    if not out:
        raise DataError(f"{path}: the file has a header but no rows.")
    return out


def _swallowed(row: list[str], delimiter: str, width: int, seen: list[set[str]]) -> int:
    """How many lines inside a row's quoted fields look like rows of the file (0: none): as many
    fields as the header, one of them a value its column already holds (a label). A quote that is
    never matched reads such rows into one field; a text's own line breaks seldom look like that
    (a quoted TSV field with a tab and a line break in it, as pandas and csv write one, is a field)."""
    count = 0
    for x in row:
        if "\n" not in x:
            continue
        if width < 2:  # one column: every line has the file's shape, and a multi-line text is legal
            continue
        lines = x.splitlines()
        for line in lines[1:-1] or lines[1:]:
            pieces = line.split(delimiter)
            if len(pieces) == width and any(p in col for p, col in zip(pieces, seen) if 0 < len(col) <= _FEW):
                count += 1
    return count


_FEW = 100  # a column with at most this many distinct values so far is label-like (_swallowed)


def label_name(value: object) -> str | None:
    """A label as its name: strings as written (trimmed, in Unicode's composed form NFC, so that an
    "é" typed as e + combining accent is the same class as "é"); numbers (a Decimal too), and
    strings that spell a number, canonically (1, 1.0, "1" and "1.0" are one class "1"; 0.5 is "0.5";
    whole numbers exactly, however large: 9007199254740993 is not 9007199254740992); booleans and
    the strings "true" / "false" in any case as "true" / "false" (a CSV writes True where JSON has
    true); None for a missing label (null, empty)."""
    if value is None or isinstance(value, (list, dict)) or (isinstance(value, float) and not math.isfinite(value)):
        return None  # NaN (JSON's NaN, pandas' missing value) is no label, nor is an infinity
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (bytes, bytearray)):
        return None  # not a name: said as "no label (b'...')"
    if isinstance(value, numbers.Integral):  # named as the same number spelt as a string is
        return _decimal_name(decimal.Decimal(int(value)))
    text = unicodedata.normalize("NFC", str(value).strip())
    if not text:
        return None
    if text.lower() in ("true", "false"):
        return text.lower()
    if isinstance(value, numbers.Number) or _NUMBER.fullmatch(text):
        try:
            x = decimal.Decimal(text)
        except decimal.InvalidOperation:
            return text
        return _decimal_name(x) if x.is_finite() else None  # NaN and infinities are no label, as a float NaN
    return text


def _decimal_name(x: "decimal.Decimal") -> str:
    """A finite number's class name: a whole number's digits (up to 3,000 of them; 1e99999999 would
    take minutes to write out), else the shortest float that is exactly it ("0.5"), else its exact
    decimal form ("1E-400": as a float it was 0.0, one class with every other tiny number)."""
    if x.adjusted() < 3000:
        if x == x.to_integral_value():
            return str(int(x))
        shortest = repr(float(x))
        if decimal.Decimal(shortest) == x:
            return shortest
    wide = decimal.Context(prec=max(28, len(x.as_tuple().digits)), Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
    return str(x.normalize(wide))  # every digit kept, trailing zeros dropped: 1.50E+5000 and 1.5E+5000 are one


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


_JSON_KIND = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object",
              bytes: "bytes"}
_OBJECTS = ('Write each record as an object of named fields, e.g. {"text": "...", "label": "..."}; texts alone '
            'go one per line in a .txt file.')


def _kind(value: object) -> str:
    """What a JSON value is, for a message: "list (a list)", "str (a string)", "null"."""
    if value is None:
        return "null"
    return f"{type(value).__name__} ({_JSON_KIND.get(type(value), 'a string' if isinstance(value, str) else 'a value')})"


def _describe(value: object, escape: bool = False) -> str:
    """A value as a message shows it: JSON, or Python's repr for what JSON has no form of (bytes,
    Decimal, dates: columns of a Parquet file), at most 40 characters."""
    shown = json.dumps(value, ensure_ascii=escape, default=repr)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def read_lines(path: Path, what: str = "texts", skip_blank: bool = False) -> list[str]:
    """The lines of a plain text file (one text per line, trimmed), so that answer i is line i + 1,
    or a DataError saying why not. A blank (or whitespace-only) line with a text after it is an
    error naming it, unless `skip_blank` (for a caller that keeps no line numbers, e.g. a
    pre-training corpus); blank lines at the end are ignored. Lines end at \\n, \\r\\n or \\r only
    (as an editor counts them), not at the other characters str.splitlines breaks on. The path "-"
    reads standard input, as other command-line tools do."""
    if str(path) == "-":
        path, text = STDIN, _read_stdin(what)
    else:
        path = Path(path)
        if path.is_dir() and (path / "dataset_dict.json").is_file():  # several splits: which one is not ours to guess
            splits = sorted(p.name for p in path.iterdir() if is_hf_split_folder(p))
            raise DataError(f"{path}: a DatasetDict folder (splits: {', '.join(splits) or 'none'}); give the folder of "
                            f"one split, e.g. {path / ('test' if 'test' in splits or not splits else splits[0])}")
        if path.is_dir():
            raise DataError(f"{path}: is a folder; give a file with one of the {what} per line")
        if not path.exists():  # a pipe (`<(cmd)`, /dev/stdin) is read as a file is: it is not a regular file
            raise DataError(f"{path}: no such file; give a file with one of the {what} per line (or - to read "
                            f"standard input)")
        if path.suffix.lower() in COMPRESSED:
            raise DataError(f"{path}: {compressed_note(path)}")
        text = _decode(path, path.read_bytes()).replace("\r\n", "\n").replace("\r", "\n")  # as an editor counts lines
    lines = [ln.strip() for ln in text.split("\n")]  # newlines translated
    lines = ["" if blank(ln) else ln for ln in lines]  # a line of zero-width spaces is a blank line
    while lines and not lines[-1]:
        lines.pop()
    empty = [n for n, ln in enumerate(lines, 1) if not ln]
    if empty and not skip_blank:
        raise _blank_lines_error(path, empty, what, f"remove them, or give the {what} in a .jsonl file")
    lines = [ln for ln in lines if ln]
    if not lines:
        raise DataError(f"{path}: the file is empty (no non-blank lines); give one of the {what} per line")
    return lines


def _read_stdin(what: str, each: str = "") -> str:
    """Standard input as UTF-8 text (a byte-order mark dropped, newlines translated), or a DataError.
    `each`: what one line holds, where it is not one of the `what`s itself."""
    if sys.stdin is None or sys.stdin.isatty():
        raise DataError(f"--input -: standard input is a terminal, not a pipe or file; pipe the {what} in "
                        f"(e.g. `cat {'records.jsonl' if each else 'texts.txt'} | frozentune ...`), one per line"
                        + (f", as {each}" if each else ""))
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"<standard input>: not UTF-8 text (byte 0x{data[e.start:e.start + 1].hex()} at byte offset "
                        f"{e.start:,}); convert it to UTF-8 (e.g. iconv -t UTF-8) before piping it in") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


_SURROGATE = re.compile("[\ud800-\udfff]")


def unencodable(text: str, argv: bool = False) -> str | None:
    """Why `text` is not valid Unicode (it holds a lone UTF-16 surrogate, which cannot be encoded
    as UTF-8 or tokenised), naming its first bad character's offset (counting from 0), or None.

    JSON lets a string hold one (`"\\ud800"`), and Python carries a command-line byte that is not
    UTF-8 as one (U+DC80..U+DCFF, surrogateescape): with `argv` (the text came from the command line),
    that byte is named. The caller adds where and what to do, e.g. `f"texts[0]: {why}; send valid Unicode"`."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    code = ord(found.group())
    byte = f"; the byte 0x{code - 0xDC00:02x}, which is not UTF-8" if argv and 0xDC80 <= code <= 0xDCFF else ""
    return (f"character offset {found.start():,} is a lone UTF-16 surrogate (U+{code:04X}{byte}), "
            f"which is not text")


def blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace, control and format characters (zero-width
    spaces and joiners, a byte-order mark, a soft hyphen), which a tokenizer drops or reads as no word."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def invisible(text: str) -> str:
    """For a blank text that is not just whitespace, a note naming its first invisible character,
    e.g. " (only invisible characters: U+200B ZERO WIDTH SPACE)"; "" otherwise."""
    shown = next((ch for ch in text if not ch.isspace()), None)
    if shown is None:
        return ""
    return f" (only invisible characters: U+{ord(shown):04X} {unicodedata.name(shown, 'a control character')})"


def _text_problem(value: object, fld: str) -> tuple[str, str] | None:
    """(the kind of problem, its detail for this row) when `value` (field `fld` of a record) is not
    a usable text, or None. Rows are counted by kind; the detail adds what differs between them."""
    if not isinstance(value, str):  # the value is the detail: rows holding other numbers are counted alike
        if value is None:
            return f"field {fld!r} holds null, not text", ""
        return f"field {fld!r} holds {_JSON_KIND.get(type(value), 'a value')}, not text", f" ({_describe(value)})"
    if blank(value):
        return f"empty text in field {fld!r}", invisible(value)
    if (why := unencodable(value)) is not None:
        return f"field {fld!r} is not valid Unicode", f": {why}"
    return None


class FieldNowhere(DataError):
    """A field no row of a file has: eval adds what its labels say. `fields`: those of its first row."""

    def __init__(self, message: str, path: Path, field: str, fields: list[str]):
        super().__init__(message)
        self.path, self.field, self.fields = path, field, fields


def label_values(path: Path, label_field: str) -> set[str]:
    """The label names a file's rows hold in `label_field` (none where no row has it)."""
    return {name for _, rec in read_records(Path(path)) if label_field in rec
            and (name := label_name(rec[label_field])) is not None}


class _Problems:
    """The rows of a file with something wrong, by kind, so that the error names the first and how many
    share it (a missing field too: in every row, the field is named wrongly; in some, those rows lack it)."""

    def __init__(self, path: Path, flags: str, pair_field: str | None):
        self.path, self.flags, self.pair_field = path, flags, pair_field
        self.lines: dict[str, list[int]] = {}  # kind of problem → its lines
        self.details: dict[str, str] = {}      # kind of problem → the first row's detail
        self.advice: dict[str, str] = {}       # kind of problem → what to do, where not the usual
        self.absent: dict[str, tuple[str, list[str]]] = {}  # missing-field kind → (the field, the first row's fields)
        self.rows = 0

    def add(self, n: int, kind: str, detail: str) -> None:
        self.lines.setdefault(kind, []).append(n)
        self.details.setdefault(kind, detail)

    def missing(self, n: int, rec: dict, fields: Sequence[str]) -> bool:
        """Whether the record lacks one of `fields` (counted as a problem)."""
        if not (gone := [fld for fld in fields if fld not in rec]):
            return False
        kind = f"missing field {gone[0]!r}"
        flag = "--text-pair-field" if self.pair_field is not None and gone[0] == self.pair_field else self.flags
        self.add(n, kind, f"; the fields here are: {', '.join(map(repr, rec))}")
        self.absent.setdefault(kind, (gone[0], list(rec)))
        self.advice.setdefault(kind, f"Choose the field{'s' if '/' in flag else ''} with {flag}")
        return True

    def check(self) -> None:
        if not self.lines:
            return
        what, at = min(self.lines.items(), key=lambda kv: kv[1][0])
        head, rows = f"{self.path}:{at[0]}: {what}", "those rows" if len(at) > 1 else "that row"
        if what in self.advice:
            if len(at) == self.rows > 1:
                message = f"{head} in all {self.rows:,} rows{self.details[what]}. {self.advice[what]}."
                if what in self.absent:
                    raise FieldNowhere(message, self.path, *self.absent[what])
                raise DataError(message)
            raise DataError(f"{head}{self.details[what]}{rows_like_it(at)}. {self.advice[what]}, or fix or remove "
                            f"{rows}.")
        raise DataError(f"{head}{self.details[what]}{rows_like_it(at)}. Fix or remove {rows}, or pick the columns "
                        f"with {self.flags}.")


def read_texts(path: Path, text_field: str = "text", pair_field: str | None = None,
               skip_blank: bool = False) -> list[Text]:
    """The texts (pairs with `pair_field`) of a .jsonl/.csv/.tsv file, no labels needed: what
    predict reads. A missing field or an empty / non-string text is an error naming the line and how
    many rows share it; with `skip_blank` (a pre-training corpus, a bag of texts) an empty text or
    blank row is skipped."""
    check_field_names(text_field, "label", pair_field)
    out: list[Text] = []
    fields = (text_field, pair_field) if pair_field else (text_field,)
    problems = _Problems(STDIN if str(path) == "-" else Path(path),
                         "--text-field / --text-pair-field" if pair_field else "--text-field", pair_field)
    for n, rec in read_records(Path(path), skip_blank):
        problems.rows += 1
        if problems.missing(n, rec, fields):
            continue
        if skip_blank and any(isinstance(rec[fld], str) and blank(rec[fld]) for fld in fields):
            continue
        for kind, detail in filter(None, (_text_problem(rec[fld], fld) for fld in fields)):
            problems.add(n, kind, detail)
        out.append((rec[text_field], rec[pair_field]) if pair_field else rec[text_field])
    problems.check()
    return out


def rows_like_it(lines: Sequence[int], what: str = "like it") -> str:
    """The count and first lines of rows sharing a problem, as an error message adds them (nothing
    for one row): " (N rows like it: lines 3, 6, ...)", or with `what` in place of "like it"."""
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    return f" ({len(lines):,} rows {what}: lines {shown})" if len(lines) > 1 else ""


def read_split(path: Path, text_field: str = "text", label_field: str = "label",
               pair_field: str | None = None) -> TextSplit:
    """A classification split from one file; with `pair_field`, each text is the pair (text_field,
    pair_field). Missing fields, empty / non-string texts and missing labels are errors that name
    the line and how many rows have the same problem."""
    texts, labels, lines = [], [], []
    spellings: dict[str, set[str]] = {}
    fields = (text_field, pair_field, label_field) if pair_field else (text_field, label_field)
    problems = _Problems(path, "--text-field / --text-pair-field / --label-field" if pair_field
                         else "--text-field / --label-field", pair_field)
    for n, rec in read_records(path):
        problems.rows += 1
        if problems.missing(n, rec, fields):  # counted like the problems below (it stopped at the first)
            continue
        label = label_name(rec[label_field])
        found = [_text_problem(rec[fld], fld) for fld in fields[:-1]]
        if isinstance(rec[label_field], (list, dict)):  # "no label" of ["DESC"]: one is there, in a list
            kind = "a list" if isinstance(rec[label_field], list) else "a JSON object"
            found.append((f"field {label_field!r} holds {kind}, not a label (one class per row: multi-label data is "
                          f"not supported)", f" ({_describe(rec[label_field])})"))
        elif label is None:  # the value is the detail: rows of other missing values are counted alike
            found.append((f"no label in field {label_field!r}", f" ({_describe(rec[label_field])})"))
        elif (why := unencodable(raw if isinstance(raw := rec[label_field], str) else label)) is not None:
            found.append((f"field {label_field!r} is not valid Unicode", f": {why}"))
        else:
            raw = rec[label_field]  # a decomposed spelling is shown escaped: it looks like the composed one
            spellings.setdefault(label, set()).add(_describe(raw, escape=isinstance(raw, str)
                                                              and not unicodedata.is_normalized("NFC", raw)))
        for kind, detail in filter(None, found):
            problems.add(n, kind, detail)
        texts.append((rec[text_field], rec[pair_field]) if pair_field else rec[text_field])
        labels.append(label)
        lines.append(n)
    problems.check()
    return TextSplit(texts, labels, str(path), lines,
                     label_spellings={k: sorted(v) for k, v in spellings.items()}, file=str(path))


# ----------------------------------------------------------------------------- datasets
def _find_split_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    if (folder / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk: one subfolder per split
        for p in sorted(folder.iterdir()):
            if is_hf_split_folder(p) and p.name.lower() in SPLIT_ALIASES:
                found.setdefault(SPLIT_ALIASES[p.name.lower()], p)
        return found
    if is_hf_split_folder(folder):  # Dataset.save_to_disk: one split, used as train
        return {"train": folder}
    for p in sorted(folder.iterdir()):
        shard = _HUB_SHARD.fullmatch(p.stem.lower())  # the Hub's layout: data/train-00000-of-00001.parquet
        stem = shard.group(1) if shard else p.stem.lower()
        if p.suffix.lower() in SUFFIXES and stem in SPLIT_ALIASES:
            split = SPLIT_ALIASES[stem]
            if shard and int(shard.group(3)) > 1:
                raise DataError(f"{folder}: the {split} split is in {int(shard.group(3))} shard files ({p.name}, ...); "
                                f"frozentune reads one file per split: join them into one (e.g. datasets.load_dataset("
                                f"'parquet', data_files=...).save_to_disk(FOLDER), then --data FOLDER)")
            if split in found:
                raise DataError(f"{folder}: two files for the {split} split "
                                f"({found[split].name}, {p.name}); keep one.")
            found[split] = p
    if not found and (folder / "data").is_dir():  # a dataset repository cloned from the Hub keeps its files in data/
        return _find_split_files(folder / "data")
    return found


_HUB_SHARD = re.compile(r"(.+?)-(\d+)-of-(\d+)")


def resolve(data: str) -> tuple[str, dict[str, Path]]:
    """Turn a dataset name, folder or file into (display name, {split: file})."""
    if not isinstance(data, (str, os.PathLike)):
        raise DataError(f"data: {type(data).__name__} ({' '.join(str(data).split())[:40]}); give a dataset name, or the path of a file or "
                        f"folder (a str or Path)")
    data = str(data)
    path = Path(data).expanduser()
    if path.is_file():
        return path.stem, {"train": path}
    if path.is_dir():
        files = _find_split_files(path)
        if not files:  # a folder of a test file alone is read (eval, cache); training says it needs train
            raise DataError(f"{path}: no train file found (expected train.jsonl / .json / .csv / .tsv / .parquet / "
                            f".arrow, optionally validation.* and test.*, or those in a data/ subfolder as the Hub "
                            f"keeps them; or a save_to_disk folder with a train split).")
        return path.name, files
    if path.exists():  # a pipe (`--data <(cmd)`), a device: read more than once (splits, the cache key's checksum)
        raise DataError(f"{data}: not a regular file (a pipe or a device); datasets are read more than once, so save "
                        f"it to a file first and give that file")
    if data == "-":
        raise DataError("-: datasets are not read from standard input (they are read more than once); save it to a "
                        "file first and give that file")
    if os.sep not in data and not path.suffix:
        root = data_root()
        folder = root / data
        if folder.is_dir():
            return data, _find_split_files(folder)
        if not root.is_dir():  # not an unknown name: no folder of named datasets was found at all
            raise DataError(f"dataset {data!r}: named datasets are read from $FROZENTUNE_DATA, else ../shared/data "
                            f"beside the checkout or the current folder, and {root} does not exist; set "
                            f"FROZENTUNE_DATA to the folder that holds {data}/, or pass a file or folder.")
        raise DataError(f"unknown dataset {data!r}: {folder} does not exist. Named datasets are "
                        f"read from $FROZENTUNE_DATA or ../shared/data; or pass a file or folder.")
    raise DataError(f"{data}: no such file or folder. Give a .jsonl / .csv / .tsv / .parquet / .arrow file, a folder "
                    f"of train / validation / test files, or a dataset name (those in {data_root()})")


def resolved_files(files: dict[str, Path]) -> dict[str, str]:
    """{split: absolute path} of resolve's files: which files a dataset was read from."""
    return {k: str(Path(p).resolve()) for k, p in sorted(files.items())}


def stratified_split(labels: list[str], fraction: float, seed: int,
                     every_class: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified (keep, carve) index split; same seed → same split. A class of one example stays
    on the keep side (one such class turned stratification off for every class, and a class could then go
    wholly into the carve). Where the carve is smaller than the number of classes it is spread over them in
    proportion, or, with every_class (a test split: every class scored), raised to one of each."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    n_carve = max(1, int(round(fraction * len(labels))))
    pool = np.array([i for i in idx if counts[labels[i]] >= 2], dtype=np.int64)  # the rest stay on the keep side
    classes = sum(1 for c in counts.values() if c >= 2)
    if every_class:
        n_carve = max(n_carve, classes)
    n_carve = min(n_carve, len(pool) - classes)  # each class keeps an example
    if n_carve < 1:
        raise CarveError(f"cannot carve {fraction:.0%} of {len(labels)} examples into a separate split and keep an "
                         f"example of every class; give more data or an explicit validation/test file.")
    if n_carve >= classes:  # every class on both sides (with no class of one, the split it always was)
        keep_p, carve = train_test_split(pool, test_size=n_carve, random_state=seed,
                                         stratify=[labels[i] for i in pool])
    else:
        carve = _spread_carve(pool, [labels[i] for i in pool], n_carve, seed)
    keep = np.setdiff1d(idx, carve)
    return np.sort(keep), np.sort(np.asarray(carve))


def _spread_carve(pool: np.ndarray, labels: list[str], n_carve: int, seed: int) -> np.ndarray:
    """n_carve of `pool` (fewer than its classes), classes chosen in proportion to their size (largest remainder,
    ties broken by a seeded shuffle) and an example of each drawn at random: a class gives at most its size - 1."""
    rng = np.random.default_rng(seed)
    members: dict[str, list[int]] = {}
    for i, lab in zip(pool, labels):
        members.setdefault(lab, []).append(int(i))
    names = sorted(members)
    quota = np.array([n_carve * len(members[c]) / len(pool) for c in names])
    take = np.minimum(np.floor(quota).astype(int), [len(members[c]) - 1 for c in names])
    order = rng.permutation(len(names))
    order = order[np.argsort(-(quota - take)[order], kind="stable")]  # largest remainder first, ties shuffled
    for k in order:
        if take.sum() >= n_carve:
            break
        if take[k] < len(members[names[k]]) - 1:
            take[k] += 1
    return np.concatenate([rng.choice(members[c], t, replace=False) for c, t in zip(names, take) if t] or
                          [np.zeros(0, dtype=np.int64)])


def _same_text(text: str) -> str:
    """A text as copies of it share it: its words, spacing and case aside, and in one Unicode form
    (an "é" written as one character or as "e" + a combining accent, as macOS files and some
    scrapers write it, is the same text on screen and to the tokenizer)."""
    return unicodedata.normalize("NFC", " ".join(unicodedata.normalize("NFD", text).split()).casefold())


def _text_key(text: Text) -> Text:
    """What makes two texts copies of each other: the same words, spacing, case and Unicode form aside."""
    if is_pair(text):
        return tuple(_same_text(t) for t in text)  # type: ignore[return-value]
    return _same_text(text)  # type: ignore[arg-type]


def text_groups(texts: Sequence[Text]) -> np.ndarray:
    """(N,) int64: the same number for copies of a text, numbered in order of first occurrence."""
    first: dict[Text, int] = {}
    return np.array([first.setdefault(_text_key(t), len(first)) for t in texts], dtype=np.int64)


def first_rows(group: np.ndarray) -> np.ndarray:
    """The first row of each group (text_groups' numbers), in the order of the groups' numbers."""
    return np.unique(group, return_index=True)[1]


def split_by_groups(group: np.ndarray, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows outside, rows inside) the groups at positions `chosen` of the sorted group numbers: a split
    made over the groups' first rows (first_rows), given back to every row of each group."""
    inside = np.isin(group, np.unique(group)[chosen])
    return np.flatnonzero(~inside), np.flatnonzero(inside)


def grouped_split(texts: Sequence[Text], labels: list[str], fraction: float,
                  seed: int, every_class: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(keep, carve, copies): stratified_split over the distinct texts, so that every copy of a text
    falls on the same side (a copy on each side would score the model on a text it trained on).
    Without copies it is stratified_split itself. `copies`: rows that repeat an earlier text."""
    group = text_groups(texts)
    n_groups = int(group.max()) + 1 if len(group) else 0
    if n_groups == len(texts):
        keep, carve = stratified_split(labels, fraction, seed, every_class)
    else:
        try:
            _, carve_g = stratified_split([labels[i] for i in first_rows(group)], fraction, seed, every_class)
        except CarveError:  # it counted the distinct texts as "examples": 40 rows of one text read "of 1 examples"
            raise CarveError(f"cannot carve {fraction:.0%} of {len(texts):,} rows into a separate split: they hold "
                            f"{n_groups:,} distinct text{'s' if n_groups != 1 else ''} (spacing, case and Unicode form aside), and "
                            f"the copies of a text stay on one side; give more distinct texts or an explicit "
                            f"validation/test file") from None
        keep, carve = split_by_groups(group, carve_g)
    if missing := sorted(set(labels) - {labels[i] for i in keep}):  # a class with one (distinct) text
        raise CarveError(f"cannot carve {fraction:.0%} of {len(labels):,} examples ({n_groups:,} distinct texts) into a "
                        f"separate split and keep every class in train: {', '.join(map(repr, missing))} would be only "
                        f"in the carved part; give more examples of it, or an explicit validation/test file")
    return keep, carve, len(texts) - n_groups


def copies_note(copies: int) -> str:
    return (f"; {copies:,} rows repeat an earlier text (spacing, case and Unicode form aside), and every copy went to the same "
            f"side" if copies else "")


PHRASE_SHARE = 0.25     # at least this share of texts inside other texts → a phrase treebank
MAX_PHRASE_WORDS = 64   # the phrase check only compares texts up to this long (keeps it cheap)

Phrase = tuple[str, ...]


def _words(text: str) -> Phrase:
    return tuple(text.lower().split())


def sub_phrases(texts: list[str]) -> set[Phrase]:
    """Every strictly shorter contiguous word sequence of the texts of ≤ MAX_PHRASE_WORDS words
    (longer texts, e.g. reviews, are skipped: a phrase treebank is made of sentences)."""
    out: set[Phrase] = set()
    for text in texts:
        w = _words(text)
        if len(w) > MAX_PHRASE_WORDS:
            continue
        for n in range(1, len(w)):
            out.update(w[a:a + n] for a in range(len(w) - n + 1))
    return out


def inside_other_texts(texts: list[Text]) -> np.ndarray:
    """(N,) bool: text i is a strict sub-phrase of another text (both ≤ MAX_PHRASE_WORDS words).
    Sentence pairs are never a phrase treebank: all False."""
    if texts and is_pair(texts[0]):
        return np.zeros(len(texts), dtype=bool)
    grams = sub_phrases(texts)
    return np.array([_words(t) in grams for t in texts], dtype=bool)


def carve_validation(train: TextSplit, fraction: float, seed: int) -> tuple[TextSplit, TextSplit, str]:
    """(train, validation, note): a seeded, stratified validation split carved from train.

    A train file that is a phrase treebank (SST: sentences plus the phrases of their parse trees,
    ≥ PHRASE_SHARE of texts inside other texts) would leak through a random carve: validation
    would be phrases of training sentences and early stopping would reward memorising. There the
    validation split is `fraction` of the *whole* texts (inside no other text), and train loses
    the phrases that occur only in validation texts (inside a validation text and inside no
    remaining whole training text) and any copy of a validation text.
    """
    inside = inside_other_texts(train.texts)
    if inside.mean() < PHRASE_SHARE:
        keep, carve, copies = grouped_split(train.texts, train.labels, fraction, seed)
        val = train.subset(carve, f"{train.source} ({fraction:.0%} carved as validation, seed {seed})")
        return (train.subset(keep), val,
                f"no validation split: carved {fraction:.0%} of train (seed {seed}){copies_note(copies)}")
    whole = np.flatnonzero(~inside)
    keep_w, carve_w = stratified_split([train.labels[i] for i in whole], fraction, seed)
    val_idx, kept_whole = whole[carve_w], whole[keep_w]
    val_texts = {_words(train.texts[i]) for i in val_idx}
    val_only = (sub_phrases([train.texts[i] for i in val_idx])
                - sub_phrases([train.texts[i] for i in kept_whole]))
    leak = np.array([_words(t) in val_texts or _words(t) in val_only for t in train.texts])
    leak[val_idx] = True
    keep = np.flatnonzero(~leak)
    val = train.subset(val_idx, f"{train.source} ({fraction:.0%} of its whole texts carved as "
                                f"validation, seed {seed})")
    note = (f"no validation split: {inside.mean():.0%} of train texts are phrases of other texts, so "
            f"validation is {fraction:.0%} of the {len(whole):,} whole texts ({len(val_idx):,}, seed "
            f"{seed}) and {int(leak.sum()) - len(val_idx):,} phrases found only in them (or copies) "
            f"left train")
    return train.subset(keep), val, note


def sample_shots(train: TextSplit, shots: int, seed: int) -> tuple[TextSplit, str]:
    """(K examples of each class, note): a seeded sample without replacement, drawn from the whole
    texts when train is a phrase treebank (a few-shot user labels sentences, not their phrases).
    K different texts: a copy of a text already drawn is replaced by another draw (a sample without
    copies is the plain draw). A class with fewer than K examples (or different texts) is an error
    naming it."""
    inside = inside_other_texts(train.texts)
    treebank = bool(inside.mean() >= PHRASE_SHARE)
    pool = np.flatnonzero(~inside) if treebank else np.arange(len(train))
    labels = np.array(train.labels, dtype=object)[pool]
    rng = np.random.default_rng(seed)
    classes = {lab: pool[labels == lab] for lab in sorted(set(train.labels))}
    short = [(len(m), lab, "training examples") for lab, m in classes.items() if len(m) < shots]
    if not short:  # rows enough: K different texts too? (a copy of a drawn text is drawn again: _distinct_draw)
        short = [(n, lab, "different texts") for lab, m in classes.items()
                 if (n := len({_text_key(train.texts[i]) for i in m})) < shots]
    if short:
        n, lab, what = min(short)  # the smallest class: the most --shots can be (the first in order was named)
        others = f" ({len(short) - 1} other class(es) have fewer than {shots} too)" if len(short) > 1 else ""
        raise DataError(f"--shots {shots}: class {lab!r} has only {n} {what}" + (" among the whole texts" if treebank
                        else "") + f"{others}; give --shots {n} or fewer")
    keep = [_distinct_draw(train.texts, members, shots, rng) for members in classes.values()]
    idx = np.sort(np.concatenate(keep))
    where = "whole texts (train is a phrase treebank)" if treebank else "train"
    return (train.subset(idx, f"{train.source} ({shots} per class, seed {seed})"),
            f"--shots {shots}: {len(idx)} examples, {shots} of each class drawn from {where} (seed {seed})")


def _distinct_draw(texts: Sequence[Text], members: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k of `members` (row indices) drawn without replacement, whose texts differ (spacing, case and Unicode form aside):
    the plain draw, with a copy of a text already drawn replaced by a draw from the rows left (sample_shots
    has checked that they hold k different texts)."""
    drawn = rng.choice(members, k, replace=False)
    seen, out = set(), []
    for i in drawn:
        if (key := _text_key(texts[i])) not in seen:
            seen.add(key)
            out.append(int(i))
    if len(out) < k:
        left = [int(i) for i in members if _text_key(texts[i]) not in seen]
        while len(out) < k and left:
            i = left.pop(int(rng.integers(len(left))))
            if (key := _text_key(texts[i])) not in seen:
                seen.add(key)
                out.append(i)
    return np.array(out, dtype=np.int64)


def whole_count(flag: str, value: object) -> int | None:
    """A count a call gave (--shots, --max-train, --max-test...) as an int (numpy's ints too, saved as JSON);
    None stays None; anything but a whole number ("4", 2.5, True) is a DataError naming it."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise DataError(f"{flag} {value!r}: give a whole number")
    return None if value is None else int(value)


def check_field_names(text_field: object, label_field: object = "label", pair_field: object = None) -> None:
    """Field names as a call gave them: text (text and pair fields may be None: the default); any other
    type was looked up as a field and said to be missing ("missing field None")."""
    for flag, value, may_be_none in (("--text-field", text_field, True), ("--label-field", label_field, False),
                                     ("--text-pair-field", pair_field, True)):
        if value is None and may_be_none:
            continue
        if not isinstance(value, str) or not value:
            raise DataError(f"{flag} {value!r}: give the name of a field of the records, as text (e.g. "
                            f"{'label' if flag == '--label-field' else 'text'})")


def text_fields(name: str, text_field: str | None, pair_field: str | None,
                files: dict[str, Path] | None = None, label_field: str | None = None) -> tuple[str, str | None]:
    """(text field, pair field or None) to read: as given; a named pair dataset (snli, rte, mrpc)
    given no --text-field reads its two fields (unless its rows have a `text` field: a user's file
    that happens to be called rte.jsonl); anything else given none reads `text`. A `label_field` that is
    one of them is refused: the label would be read as input, and every score would be 100."""
    named = PAIR_FIELDS.get(name)
    if named and text_field in (None, "text") and not (files and "text" in first_fields(files)):
        text_field, pair_field = named[0], pair_field or named[1]  # its own first field; the second as given or its own
    if pair_field is not None and pair_field == (text_field or "text"):
        raise DataError(f"--text-pair-field {pair_field!r} is the --text-field too"
                        + (f" ({name}'s pairs are {named[0]}, {named[1]})" if named else "")
                        + "; name the field of the second text of each pair")
    text_field = text_field or "text"
    if label_field is not None and label_field in (text_field, pair_field):
        flag = "--text-field" if label_field == text_field else "--text-pair-field"
        raise DataError(f"--label-field {label_field!r} is the {flag} too: the label would be read as the input, and "
                        f"the model would score 100 by reading it; name the field of the texts with {flag}")
    return text_field, pair_field


def first_fields(files: dict[str, Path]) -> set[str]:
    """The fields of the first record of a dataset's first file (empty for an empty file)."""
    path = files.get("train") or next(iter(files.values()))
    records = read_records(Path(path))
    return set(records[0][1]) if records else set()


def one_side_note(name: str, files: dict[str, Path], text_field: str, pair_field: str | None) -> list[str]:
    """A note when a pair dataset is read as single texts of one of its two fields (a
    hypothesis-only baseline is a real experiment, but it should not happen unnoticed)."""
    named = PAIR_FIELDS.get(name)
    if not named or pair_field is not None or text_field not in named or not set(named) <= first_fields(files):
        return []
    other = named[1] if text_field == named[0] else named[0]
    return [f"{name}'s rows are sentence pairs ({named[0]}, {named[1]}); --text-field {text_field} alone reads "
            f"{text_field} as single texts and leaves {other} out (for pairs, also give --text-pair-field {other})"]


def load_classification(data: str, text_field: str | None = "text", label_field: str = "label",
                        val_fraction: float = 0.1, seed: int = 0,
                        max_train: int | None = None, shots: int | None = None,
                        carve_below: int = 0, pair_field: str | None = None, test_only: bool = False,
                        renamed: Mapping[str, str] | None = None) -> Dataset:
    """Load a classification dataset by name, folder or file. With `pair_field` (or a named pair
    dataset: snli, rte, mrpc) every text is a (text_field, pair_field) sentence pair.

    A folder with validation and test files but no train file (SNLI here: its train split is not
    available offline) trains on the validation file, a note says so.
    A missing validation split is carved from train (stratified, seeded), unless train has fewer
    than `carve_below` examples (the trainer then cross-validates on train, and validation is an
    empty split); a single file also gives up 10% as the test split. `shots` keeps K examples of
    each class (seeded; whole sentences of a phrase treebank), before any validation carve.
    `max_train` keeps a stratified sample of train after it (for quick runs).
    `test_only`: the test split alone is wanted (scoring a saved model): it does not depend on what is
    drawn from train afterwards (shots, validation, max_train), so none of that is done or said, and a
    train too small to give a validation split does not stop the test split being scored.
    `renamed`: a saved model's labels → the names it was trained with (`frozentune relabel`). Where every label of
    the data is one of the model's, the rows are drawn as under the trained names (the carves and samples order
    classes by name, and the rows' digest holds them), then named back: its splits are the training run's.
    """
    check_field_names(text_field, label_field, pair_field)
    shots, max_train = whole_count("--shots", shots), whole_count("--max-train", max_train)
    if shots is not None and max_train is not None:
        raise DataError(f"--shots {shots} and --max-train {max_train}: give one of them (K per class, or a "
                        f"stratified sample of a total size)")
    if shots is not None and shots < 1:
        raise DataError(f"--shots {shots}: give the number of examples per class, 1 or more")
    name, files = resolve(data)
    if name in GENERATION:
        raise DataError(f"{name} is a generation dataset (fields mr/refs or triples/texts); "
                        f"classification methods need text + label data.")
    rule = {"files": resolved_files(files), "seed": seed, "shots": shots, "max_train": max_train,
            "carve_below": carve_below, "val_fraction": val_fraction}
    local, named = Path(str(data)).expanduser(), data_root() / str(data)
    if os.sep not in str(data) and local.is_dir() and named.is_dir() and local.resolve() != named.resolve():
        notes_first = [f"{data!r} is read as the folder {local.resolve()} here, not the dataset of that name in "
                       f"{data_root()}; run elsewhere (or rename the folder) to read the dataset"]
    else:
        notes_first = []
    read = run_files(files)  # (snli offline: its 549k train split is not there, so it trains on its validation file)
    trains_on_validation = "train" not in files and "train" in read
    if "train" not in read:
        raise DataError(f"{data}: no train file (found {', '.join(sorted(files))}); a classifier needs "
                        f"train.jsonl / .csv / .tsv")
    files = read
    text_field, pair_field = text_fields(name, text_field, pair_field, files, label_field)
    notes_first += one_side_note(name, files, text_field, pair_field)
    splits = {k: read_split(p, text_field, label_field, pair_field) for k, p in files.items()}
    forward = as_trained(splits, renamed)
    splits = {k: with_names(sp, forward) for k, sp in splits.items()}
    if not test_only:  # eval --split train / validation: the rows the splits are drawn from (test reads none)
        rule["rows"] = rows_digest(splits)
        rule["train_rows"] = rows_digest({"train": splits["train"]})  # that file's alone: a copy of it, read by itself
    train = splits["train"]
    notes = notes_first + [f"{split.source}: labels {', '.join(forms)} read as one class {label!r}"
                           for split in splits.values() for label, forms in split.label_spellings.items()
                           if len(forms) > 1] + spelled_across(splits)
    if trains_on_validation:
        notes.append(f"no train file: training on {files['train']} (the validation split), scored on "
                     f"{files['test']}; the notes below say whether a validation split is carved from it")
    for split in splits.values():  # a class -1 beside 0, 1, ...: the unlabelled rows of a Hugging Face export
        others = set(split.labels) - {"-1"}
        if "-1" in split.labels and others and all(lab.isdigit() for lab in others):
            notes.append(f"{split.source}: {split.labels.count('-1'):,} rows have the label -1, read as a class; in "
                         f"Hugging Face datasets -1 marks a row without a label (GLUE's test files): if so, remove them")
    classes = sorted(set(train.labels))
    if len(classes) < 2 and not test_only:  # scoring a saved model: a file of one class is scored as it is
        raise DataError(f"{train.source}: every training example has the label {classes[0]!r}; a classifier "
                        f"needs at least two classes (check --label-field).")
    for name_, split in splits.items():
        unseen = sorted(set(split.labels) - set(classes))
        if name_ != "train" and unseen and not test_only:
            first = split.lines[next(i for i, lab in enumerate(split.labels) if lab in unseen)]
            raise DataError(f"{split.source}:{first}: label(s) {some(unseen)} of the {name_} split "
                            f"never occur in train (train has {some(classes)}). Fix the labels "
                            f"or add training examples of them.")
    if "test" not in splits:
        keep, carve, copies = grouped_split(train.texts, train.labels, 0.1, seed, every_class=True)
        share = len(carve) / len(train)
        splits["test"] = train.subset(carve, f"{train.source} ({share:.0%} carved as test, seed {seed})")
        train = train.subset(keep)
        more = "" if abs(share - 0.1) < 0.015 else ", more than 10% so that every class has an example on both sides"
        notes.append(f"no test split: carved 10% of {files['train']} (seed {seed}): {len(carve):,} of "
                     f"{len(carve) + len(keep):,} examples{more}{copies_note(copies)}")
    if test_only:
        return named_back(Dataset(name, train, splits.get("validation", train.subset([])), splits["test"],
                                  label_order(name, train.labels), notes, text_field, pair_field, rule), forward)
    if shots is not None:
        train, note = sample_shots(train, shots, seed)
        notes.append(note)
    carved = False
    if "validation" not in splits and len(train) < carve_below:
        splits["validation"] = TextSplit([], [], f"{train.source} (no validation split)", [])
        notes.append(f"no validation split: train has {len(train)} examples (under {carve_below}), so none is carved "
                     f"(a few held-out examples would steer training by noise; the schedule line says what is done instead)")
    elif "validation" not in splits:
        train, splits["validation"], note = carve_validation(train, val_fraction, seed)
        notes.append(note)
        carved = True
    if max_train is not None and max_train < len(set(train.labels)):
        raise DataError(f"--max-train {max_train}: give at least {len(set(train.labels))} (one example per class)")
    if max_train is not None and max_train < len(train):
        keep, _ = stratified_split(train.labels, 1 - max_train / len(train), seed)
        classes_before = set(train.labels)
        train = train.subset(keep)
        if lost := sorted(classes_before - set(train.labels)):  # the sample's, not the data's (it said "fix the label")
            raise DataError(f"--max-train {max_train}: the stratified sample of {len(train):,} examples has no example "
                            f"of {len(lost):,} of the {len(classes_before):,} classes ({some(lost)}), which the other "
                            f"splits have; give a larger --max-train, or --shots K (K of every class)")
        notes.append(f"train limited to {len(train)} examples (stratified, seed {seed})")
        carved = False  # validation came from the larger train, not from these rows
    elif max_train is not None:
        notes.append(f"--max-train {max_train}: train has {len(train)} examples, so all are used")
    labels = label_order(name, train.labels)
    return named_back(Dataset(name, train, splits["validation"], splits["test"], labels, notes, text_field,
                              pair_field, rule, carved_from_train=carved and carve_below > 0), forward)


def run_files(files: Mapping[str, Path]) -> dict[str, Path]:
    """The files a run reads as its splits (load_classification): those given; for validation and test files with no
    train file (SNLI offline), the validation file as train beside test."""
    if "train" not in files and "validation" in files and "test" in files:
        return {"train": files["validation"], "test": files["test"]}
    return dict(files)


def as_trained(splits: Mapping[str, TextSplit], renamed: Mapping[str, str] | None) -> dict[str, str] | None:
    """`renamed` (a model's labels → the names it was trained with) where every label of `splits` is one of the
    model's, so that they can be read under the trained names and named back; None otherwise (data of other names
    is read as it is, and scoring it says which labels the model lacks)."""
    if not renamed or all(k == v for k, v in renamed.items()):
        return None
    seen = {lab for sp in splits.values() for lab in sp.labels}
    # labels that are names both ways (a swap, A ↔ B): which names the data carries cannot be told, so it is read as
    # it is, as before renamed data was read under the trained names
    return dict(renamed) if seen <= set(renamed) and not seen <= set(renamed.values()) else None


def with_names(split: TextSplit, names: Mapping[str, str] | None) -> TextSplit:
    """`split` with each label renamed by `names` (the same split where None)."""
    return split if names is None else dataclasses.replace(split, labels=[names[lab] for lab in split.labels])


def named_back(ds: Dataset, forward: Mapping[str, str] | None) -> Dataset:
    """A dataset read under the trained names (as_trained) with the model's names again."""
    if forward is None:
        return ds
    back = {v: k for k, v in forward.items()}
    return dataclasses.replace(ds, train=with_names(ds.train, back), validation=with_names(ds.validation, back),
                               test=with_names(ds.test, back), labels=[back[lab] for lab in ds.labels])


def spelled_across(splits: dict[str, TextSplit]) -> list[str]:
    """The notes of labels spelt otherwise in other files (train's 1 and test's 1.0, a CSV's True and a
    JSON's true) and so read as one class: each form with the files it is in. A label whose forms are
    all in one file is said by that file's own note."""
    notes = []
    order = [splits[name] for name in ("train", "validation", "test") if name in splits]
    for label in dict.fromkeys(lab for split in order for lab in split.label_spellings):
        where: dict[str, list[str]] = {}
        for split in order:
            for form in split.label_spellings.get(label, ()):
                where.setdefault(form, []).append(Path(split.source).name)
        if len(where) > 1 and not any(set(where) <= set(s.label_spellings.get(label, ())) for s in splits.values()):
            forms = [f"{form} (in {' and '.join(files)})" for form, files in where.items()]
            notes.append(f"labels {', '.join(forms)} read as one class {label!r}")
    if len(notes) > 5:  # a thousand classes written 1 in train and 1.0 in test: five lines and a count
        notes = notes[:5] + [f"and {len(notes) - 5:,} more labels spelt otherwise in other files, each read as one class"]
    return notes


def rows_digest(splits: dict[str, TextSplit]) -> str:
    """A digest of the rows (texts and labels, in order) that a run's train and validation splits are drawn
    from: the same files edited, even only reordered, give other samples and carves."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("train", "validation"):
        for text, label in zip(splits[name].texts, splits[name].labels) if name in splits else ():
            h.update(json.dumps([name, text, label]).encode())
    return h.hexdigest()


def label_order(name: str, train_labels: list[str]) -> list[str]:
    """Canonical order for named datasets, else sorted names (numbers sorted numerically)."""
    seen = set(train_labels)
    if name in CLASSIFICATION and seen <= set(CLASSIFICATION[name]):
        return [lab for lab in CLASSIFICATION[name] if lab in seen]
    try:
        value = {lab: float(lab) for lab in seen}
    except ValueError:
        return sorted(seen)
    if not all(math.isfinite(v) for v in value.values()):  # "nan" compares with nothing: the order was the set's
        return sorted(seen)
    return sorted(seen, key=lambda lab: (value[lab], lab))


# ----------------------------------------------------------------------------- generation
@dataclass
class GenExample:
    """A data-to-text example: `source` is the linearised table, `refs` the reference texts."""
    source: str
    refs: list[str]
    meta: dict = field(default_factory=dict)
    rows: int = 1  # the rows of the file it was read from: several where rows repeat a source (see load_generation)


def table_source(where: str, rec: dict) -> str:
    """The source of an E2E record (its `mr`) or a WebNLG one (its `triples`, linearised), or a
    DataError at `where` (file:line) when it is not text, or not a list of triples of text."""
    if "mr" in rec:
        src = rec["mr"]
        if not isinstance(src, str) or blank(src):
            raise DataError(f"{where}: the source ('mr') must be non-empty text, got {_describe(src)}")
        return src
    triples = rec["triples"]
    if not (isinstance(triples, list) and triples and all(
            isinstance(t, list) and t and all(isinstance(x, str) and not blank(x) for x in t) for t in triples)):
        raise DataError(f"{where}: 'triples' must be a non-empty list of [subject, property, object] lists of text, "
                        f"got {_describe(triples)}")
    return linearize_triples(triples)


def linearize_triples(triples: list[list[str]]) -> str:
    """WebNLG triples as `subject | property | object` joined with ` ; `."""
    return " ; ".join(" | ".join(str(x).replace("_", " ") for x in t) for t in triples)


def _references(path: Path, n: int, rec: dict, target_field: str, split: str = "train") -> list:
    """A pairs record's reference texts: the list in `<target_field>s` when it has one (SciTLDR's
    `targets`: every reference), else the target field (one string, or a list of them)."""
    many = rec.get(target_field + "s")
    if isinstance(many, list) and many:
        return many
    if target_field not in rec:
        if split == "test" and n == 1:  # a wrong --target-field, or a test file of sources alone
            raise DataError(f"{path}:{n}: no {target_field!r} field (has: {', '.join(map(str, rec))}); name the target "
                            f"field with --target-field. If this test file holds sources alone, it has no references "
                            f"to score against: give one with targets, or leave it out (10% of train is then carved as "
                            f"test); `frozentune generate --input` reads sources alone")
        raise DataError(f"{path}:{n}: no {target_field!r} field (has: {', '.join(map(str, rec))}); name the target "
                        f"field with --target-field")
    value = rec[target_field]
    return value if isinstance(value, list) else [value]


def _check_unicode(where: str, texts: list[tuple[str, str]]) -> None:
    """A DataError at `where` (file:line) naming the first of the (what, text) that is not valid Unicode."""
    for what, text in texts:
        if (why := unencodable(text)) is not None:
            raise DataError(f"{where}: {what} is not valid Unicode: {why}. Fix or remove the row.")


def load_generation(name: str, split: str, source_field: str | None = None,
                    target_field: str | None = None) -> list[GenExample]:
    """Examples of one split: E2E (`mr` → `refs`), WebNLG (`triples` → `texts`), or any source → target
    pairs file (fields `source` / `target` unless named; see `_references` for several references)."""
    _, files = resolve(name)
    split = SPLIT_ALIASES.get(split, split)
    if split not in files:
        raise DataError(f"{name}: no {split!r} split (have: {', '.join(files)}).")
    pairs = source_field is not None or target_field is not None
    sf, tf = source_field or "source", target_field or "target"
    out = []
    for n, rec in read_records(files[split]):
        if not pairs and ("mr" in rec or "triples" in rec):
            src = table_source(f"{files[split]}:{n}", rec)
            refs, src_name = (rec.get("refs"), "'mr'") if "mr" in rec else (rec.get("texts"), "'triples', linearised")
            ref_field = "refs" if "mr" in rec else "texts"
            refs = [refs] if isinstance(refs, str) else refs  # one reference as a string, as a pairs file's target may be
        elif pairs or sf in rec:
            src_name = repr(sf)
            if sf not in rec:
                raise DataError(f"{files[split]}:{n}: no {sf!r} field (has: {', '.join(map(str, rec))}); name the "
                                f"source field with --source-field")
            src, refs = rec[sf], _references(files[split], n, rec, tf, split)
            ref_field = tf
            if not isinstance(src, str) or blank(src):
                raise DataError(f"{files[split]}:{n}: the source ({sf!r}) must be non-empty text, got {_describe(src)}")
        else:
            raise DataError(f"{files[split]}:{n}: a generation record needs 'mr' (E2E), 'triples' (WebNLG) or "
                            f"'source' and 'target' fields; for other names give --source-field / --target-field")
        if not isinstance(refs, list) or not refs:  # (it named 'refs' / 'texts' / the target field whichever was read)
            held = "missing" if ref_field not in rec else _describe(rec[ref_field])
            raise DataError(f"{files[split]}:{n}: no reference text ({ref_field!r}: {held}); give every row at least one "
                            f"(a non-empty string, or a list of them), or remove the row")
        bad = [r for r in refs if not isinstance(r, str) or blank(r)]
        if bad:
            raise DataError(f"{files[split]}:{n}: a reference text must be non-empty text, got {_describe(bad[0])}")
        _check_unicode(f"{files[split]}:{n}", [(f"the source ({src_name})", str(src))]
                       + [(f"reference {i + 1}", r) for i, r in enumerate(refs)])
        meta = {k: v for k, v in rec.items() if k in ("category", "eid", "seen")}
        out.append(GenExample(str(src), [str(r) for r in refs], meta))
    if not out:
        raise DataError(f"{files[split]}: no examples")
    return merge_sources(out)


def merge_sources(examples: list[GenExample]) -> list[GenExample]:
    """One example per source, in order of first occurrence: a file with one row per reference (E2E's
    CSV layout) or repeated rows gives each source all its references (each once), and `rows` says how
    many rows it had. Held out by row, a repeated source was both trained on and scored."""
    by_source: dict[str, GenExample] = {}
    for ex in examples:
        first = by_source.get(ex.source)
        if first is None:
            by_source[ex.source] = GenExample(ex.source, list(dict.fromkeys(ex.refs)), ex.meta, ex.rows)
        else:
            first.refs.extend(r for r in ex.refs if r not in first.refs)
            first.rows += ex.rows
    return list(by_source.values())


def merged_note(examples: list[GenExample], what: str) -> str | None:
    """A note where `examples` came from rows that repeat a source, else None."""
    extra = sum(ex.rows - 1 for ex in examples)
    if not extra:
        return None
    return (f"{what}: {extra:,} rows repeat the source of an earlier row; each source is one example with all its "
            f"rows' targets as references ({len(examples):,} sources)")
