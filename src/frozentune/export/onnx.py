"""Classification models as one ONNX graph: the frozen backbone once, every head on its states.

  frozentune export --model DIR [DIR ...] --format onnx --output OUT
  frozentune predict --onnx OUT "a text" ...

The graph takes `input_ids` and `attention_mask` (and `token_type_ids` for a pair model of a
tokenizer that has them), int64 (batch, tokens), both dimensions dynamic down to 1. For each head
NAME it returns `NAME.logits` (batch, classes) and the method's explanation tensors: the
self-explaining head's `NAME.span_weights` (batch, T, W), Y-Tuning's `NAME.label_attention`
(batch, C, T), the space model's `NAME.centroids`, `NAME.concept_variance` and
`NAME.token_scores`. The backbone runs once, in float32; each head reads its own layers, rounded
to float16 and back as the feature cache stores them, so ONNX predictions are `frozentune predict
--precision fp32`'s. A head trained on bf16 or int8 states (bf16 is the default on a CPU with native
bf16) is said to be one at export and in onnx.json (`trained_precision`): its `predict --model`
runs that precision, and a few labels near a tie can differ from the graph's.

Made by torch.onnx's dynamo exporter (opset 18) from the float32 backbone, with the batch and
token dimensions declared dynamic. Before anything is written, ONNX Runtime runs the graph on
batches of other shapes than the one it was traced with (one token; ragged rows) and every output
is compared with PyTorch: a dimension fixed at export time, or a mask handled differently, fails
there. The figures go into onnx.json.

OUT holds model.onnx (and model.onnx.data, its weights, which the exporter keeps beside it), the
tokenizer files and onnx.json (heads, labels, outputs, input fields,
max_length, the backbone and its weights hash, the parity check).
"""
from __future__ import annotations

import json
import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..pyterms import in_python_terms
from ..cache import blake2b_of
from ..head import Head
from . import ExportError

GRAPH = "model.onnx"
META = "onnx.json"
OPSET = 18
# parity of the check at export: |ORT − PyTorch| ≤ this × (1 + max|PyTorch|) per output. Both sides
# round the states to float16; a state that lands on the other side of a float16 rounding boundary
# moves by one float16 ulp (2^-11 relative), so a few 1e-4 relative is what two correct runs can differ by
PARITY = 1e-3
TRACE_SHAPE = (2, 7)  # (batch, tokens) of the example the exporter traces
CHECK_SHAPES = ((1, 1), (1, 3), (2, 4), (3, 17))  # (batch, tokens) other than TRACE_SHAPE: dynamic dims hold


class Graph(nn.Module):
    """The backbone's one pass and every head on it: (ids, mask[, types]) → the outputs, a flat
    tuple in `output_names` order."""

    def __init__(self, encoder: nn.Module, heads: Sequence[tuple[str, object]], sep: tuple[int, ...] | None,
                 extras: dict[str, list[str]], types: bool):
        super().__init__()
        self.encoder = encoder
        self.names = [n for n, _ in heads]
        self.heads = nn.ModuleList([m.head for _, m in heads])
        self.specs = [m.backbone_ref.layers for _, m in heads]
        self.dtypes = [m.cache_dtype for _, m in heads]
        self.temperatures = [m.temperature for _, m in heads]  # (model.divided: a constant of the graph)
        self.sep, self.extras, self.types = sep, extras, types

    @property
    def min_tokens(self) -> int:
        """The shortest input the graph takes: a pair is at least its separator and a token either side."""
        return len(self.sep) + 2 if self.sep else 1

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask"] + (["token_type_ids"] if self.types else [])

    def outputs_of(self, name: str) -> list[str]:
        """Head `name`'s outputs: its logits, then its explanation tensors."""
        return [f"{name}.{k}" for k in ["logits", *self.extras[name]]]

    @property
    def output_names(self) -> list[str]:
        return [o for n in self.names for o in self.outputs_of(n)]

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None):
        from ..backbone import select_layers, token_type_kwargs
        from ..head import Features
        from ..model import as_cached, divided
        from ..pairs import separator_mask

        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                           **token_type_kwargs(token_type_ids))
        mask = attention_mask.bool()
        sep = separator_mask(input_ids, mask, self.sep) if self.sep else None
        results = []
        for name, head, spec, dtype, t in zip(self.names, self.heads, self.specs, self.dtypes, self.temperatures):
            o = divided(head(Features(as_cached(select_layers(out.hidden_states, spec), dtype), mask, sep)), t,
                        head.logit_parts)  # as Classifier.calibrated
            results += [o.logits, *(o.extras[k] for k in self.extras[name])]
        return tuple(results)


# ----------------------------------------------------------------------------- loading the heads
def load_heads(model_dirs: Sequence[Path], names: Sequence[str] | None = None) -> list[tuple[str, object]]:
    """(name, Classifier) of each saved folder, float32 on the CPU. They must be heads on one frozen
    backbone (same weights and max_length) and take the same kind of input."""
    from .. import model as M

    dirs = [Path(d) for d in model_dirs]
    names = list(names) if names else [d.resolve().name for d in dirs]  # `--model .` is named after its folder
    if len(names) != len(dirs):
        raise ExportError(f"--name: {len(names)} names for {len(dirs)} models; give one per --model, or none")
    for i, name in enumerate(names, 1):
        if not name.strip() or any(c in name for c in "\r\n\t"):
            raise ExportError(f"--name {i}: {name!r} cannot name a head's output; give a word such as its task "
                              f"(letters, digits, - _ .)")
    if len(set(names)) != len(names):
        twice = sorted(n for n in names if names.count(n) > 1)[0]
        raise ExportError(f"two heads would both be named {twice!r} in the graph's outputs; name them with --name")
    heads = []
    for name, d in zip(names, dirs):
        config = M.read_saved(d)
        if config.get("task") == "generation":
            where = ("an encoder-decoder prefix has no PEFT form either: use it here (generate / eval / serve)"
                     if config.get("architecture") == "encoder-decoder" else "a prefix goes to PEFT with --format peft")
            raise ExportError(f"{d}: a text generator ({config.get('method')}); --format onnx exports classifiers "
                              f"({where})")
        m = M.load(d, runtime=lambda b: ("cpu", "fp32"))  # also sets the fields it was trained on
        if m.runs_live:
            why = "trains its encoder" if m.trains_backbone else "changes what the backbone computes (a prefix inside it)"
            raise ExportError(f"{d}: method {m.method!r} {why}, so it shares no frozen pass; --format onnx exports "
                              f"heads on a frozen backbone (probe, ytuning, space, selfexplain)")
        heads.append((name, m.eval()))
    first = heads[0][1]
    for name, m in heads[1:]:
        a, b = first.backbone_ref, m.backbone_ref
        if (a.weights_hash, a.max_length, a.token_types) != (b.weights_hash, b.max_length, b.token_types):
            raise ExportError(f"{name}: trained on another backbone, max_length or token types ({b.name}, {b.max_length}, "
                              f"token types {'on' if b.token_types else 'off'}) than {heads[0][0]} ({a.name}, "
                              f"{a.max_length}, {'on' if a.token_types else 'off'}); one graph holds one backbone pass: "
                              f"export them separately")
        if m.takes_pairs != first.takes_pairs:
            raise ExportError(f"{name} takes {'sentence pairs' if m.takes_pairs else 'single texts'} and "
                              f"{heads[0][0]} does not; export them as separate graphs")
    return heads


def trained_precision(model) -> str:
    """The precision of the frozen pass a loaded head was trained on (its saved config's)."""
    return model.saved_config["backbone"].get("precision", "fp32")


def build_graph(heads: list[tuple[str, object]]) -> Graph:
    """The Graph of loaded heads; each head's explanation outputs are found by running it once."""
    from ..backbone import select_layers, token_type_kwargs
    from ..head import Features
    from ..pairs import separator_ids

    bb = heads[0][1].backbone_ref
    sep = separator_ids(bb.tok) if heads[0][1].takes_pairs else None
    ids, mask, types = example_inputs(bb, sep is not None, *TRACE_SHAPE)
    extras = {}
    with torch.no_grad():
        hs = bb.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                      **token_type_kwargs(types)).hidden_states
        for name, m in heads:
            o = m.head(Features(select_layers(hs, m.backbone_ref.layers), mask.bool()))
            extras[name] = sorted(k for k, v in o.extras.items() if isinstance(v, Tensor))
    return Graph(bb.model, heads, sep, extras, types is not None).eval()


def example_inputs(bb, pairs: bool, batch: int, tokens: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
    """Tokenizer output of `batch` made-up texts (or pairs), cut to `tokens` tokens; the last row
    ragged (its second half padding) when batch > 1."""
    words = "the film was a quiet and generous surprise from start to finish with a cast that knows it".split()
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(words, size=tokens)) for _ in range(batch)]
    tk = bb.tokenize([(t, t) for t in texts] if pairs else texts)  # as the backbone feeds its texts (token types too)
    ids, mask, types = tk.padded(range(batch), bb.pad_id())
    ids, mask = ids[:, :tokens].clone(), mask[:, :tokens].clone()
    types = None if types is None else types[:, :tokens].clone()
    if batch > 1:
        mask[-1, max(1, tokens // 2):] = 0
        ids[-1, max(1, tokens // 2):] = bb.pad_id()
    return ids, mask, types


# ----------------------------------------------------------------------------- export
@in_python_terms()
def export_onnx(model_dirs: Sequence[Path], output: Path, names: Sequence[str] | None = None,
                overwrite: bool = False, log: Callable[[str], None] = print) -> dict:
    """Export saved classifiers (heads on one frozen backbone) as one ONNX graph into `output`,
    checked against PyTorch with ONNX Runtime first. Returns onnx.json's contents."""
    from ..output import check_output, staged_output
    from .card import CARD, onnx_card_text, read_result

    output = Path(output)
    check_output(output, overwrite, reads=model_dirs, kind="onnx")
    _require("onnxruntime", "onnx", "onnxscript")
    heads = load_heads(model_dirs, names)
    graph = build_graph(heads)
    bb = heads[0][1].backbone_ref
    with staged_output(output, overwrite, kind="onnx") as folder:
        t0 = time.perf_counter()
        _export(graph, bb, folder / GRAPH)
        label_graph(folder / GRAPH, [{"name": n, "labels": list(m.labels)} for n, m in heads])
        export_seconds = time.perf_counter() - t0
        check = parity(graph, bb, folder / GRAPH)
        worst = max(check["relative"].values())
        if worst > PARITY:
            name = max(check["relative"], key=check["relative"].get)
            raise ExportError(f"ONNX Runtime differs from PyTorch on {name} by {worst:.2e} (relative; limit "
                              f"{PARITY:g}); the graph was not written. Please report it with the models' methods")
        save_tokenizer(bb.tok, folder, bb.max_length, graph.input_names)
        meta = {"format": "frozentune-onnx/1", "graph": GRAPH, "opset": OPSET, "checksums": graph_checksums(folder),
                "inputs": graph.input_names, "outputs": graph.output_names, "precision": "fp32",
                "heads": [{"name": n, "method": m.method, "labels": m.labels, "layers": list(m.backbone_ref.layers.layers),
                           "outputs": graph.outputs_of(n), "from": str(Path(d).resolve()),
                           "trained_precision": trained_precision(m)}
                          for (n, m), d in zip(heads, model_dirs)],
                "pairs": bool(heads[0][1].takes_pairs), "fields": list(heads[0][1].pair_fields),
                "max_length": bb.max_length, "backbone": {"name": bb.name, "weights_hash": bb.weights_hash},
                "check": check, "export_seconds": export_seconds}
        (folder / META).write_text(json.dumps(meta, indent=2, allow_nan=False))
        (folder / CARD).write_text(onnx_card_text(meta, {n: read_result(d) for (n, _), d in zip(heads, model_dirs)}),
                                   encoding="utf-8")
    if len({tuple(m.pair_fields) for _, m in heads}) > 1:  # one graph reads one input: the first head's fields
        log(f"note: the heads were trained on different fields ({'; '.join(f'{n}: {m.pair_fields[0]}' + (f', {m.pair_fields[1]}' if m.pair_fields[1] else '') for n, m in heads)}); "
            f"`predict --onnx --input FILE` reads {heads[0][0]}'s unless --text-field / --text-pair-field say otherwise")
    trained = {n: trained_precision(m) for n, m in heads}
    if other := [f"{n} ({p})" for n, p in trained.items() if p != "fp32"]:
        log(f"note: {', '.join(other)} trained on {'/'.join(sorted(set(trained.values()) - {'fp32'}))} "
            f"states; the graph runs the backbone in fp32, so it answers as `frozentune predict --precision fp32` "
            f"does, and `predict --model` (its trained precision) may differ on a few texts near a tie")
    size = graph_bytes(output)
    log(f"wrote {output / GRAPH} ({size / 2**20:.1f} MiB with its weights file): {len(heads)} head(s) ({', '.join(n for n, _ in heads)}) on "
        f"one {bb.name} pass; inputs {', '.join(graph.input_names)}; ONNX Runtime vs PyTorch on batches "
        f"{', '.join(f'{b}×{t}' for b, t in meta['check']['shapes'])}: max relative difference {worst:.1e}")
    return meta


def save_tokenizer(tok, folder: Path, max_length: int, inputs: Sequence[str]) -> None:
    """The backbone's tokenizer, saved with model_max_length = the graph's max_length and model_input_names =
    the graph's `inputs`: a user who tokenises with it and truncation=True (as the card says) gives the graph
    the tokens predict gives it, and no input it lacks (a --no-token-types graph has no token_type_ids, which
    ONNX Runtime refused: "Invalid input name"). The loaded tokenizer is left as it was."""
    kept, init = (tok.model_max_length, tok.model_input_names), dict(tok.init_kwargs)
    # save_pretrained writes model_input_names only where init_kwargs holds the key (with the attribute's value)
    tok.model_max_length, tok.model_input_names = max_length, list(inputs)
    tok.init_kwargs["model_input_names"] = list(inputs)
    try:
        tok.save_pretrained(str(folder))
    finally:
        (tok.model_max_length, tok.model_input_names), tok.init_kwargs = kept, init


def graph_checksums(folder: Path, names: Sequence[str] | None = None) -> dict[str, str]:
    """{file name: blake2b digest} of the graph and its weights file(s) (the files named, where they exist;
    by default every model.onnx* the export wrote), which loading checks: a weights file edited or swapped
    apart from onnx.json would otherwise give other scores silently."""
    out = {}
    paths = sorted(Path(folder).glob(GRAPH + "*")) if names is None else [Path(folder) / n for n in names]
    for p in paths:
        if p.is_file():
            with open(p, "rb") as f:
                out[p.name] = blake2b_of(f)
    return out


def graph_bytes(folder: Path) -> int:
    """Size of the graph with its external weights file (the exporter keeps large weights beside it)."""
    return sum(p.stat().st_size for p in Path(folder).glob(GRAPH + "*"))


def _require(*modules: str, what: str = "export --format onnx") -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(f"{what} needs {', '.join(missing)}: pip install 'frozentune[onnx]'")


@contextmanager
def every_slot(graph: Graph):
    """Heads that skip work by the data (the self-explaining head computes only valid spans, a count
    the input's values decide) traced in their static-shape form (Head.static_shapes: the
    self-explaining head on every slot), for a graph whose shapes follow the input's shape alone; as
    they were afterwards."""
    with ExitStack() as stack:
        for h in graph.heads:
            if isinstance(h, Head):
                stack.enter_context(h.static_shapes())
        yield


# Loggers whose warnings say nothing about the user's graph: torch.onnx registering torchvision's ops
# (never used here) when torchvision is absent, and onnxscript's optimiser passing over Split nodes.
QUIET_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnxscript.optimizer._constant_folding")


@contextmanager
def quiet_loggers(names: Sequence[str] = QUIET_LOGGERS):
    """Those loggers at ERROR while the export runs, restored after."""
    import logging

    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _export(graph: Graph, bb, path: Path) -> None:
    """torch.onnx (dynamo) with dynamic batch and token dimensions."""
    ids, mask, types = example_inputs(bb, graph.sep is not None, *TRACE_SHAPE)
    batch = torch.export.Dim("batch", min=1)
    tokens = torch.export.Dim("tokens", min=graph.min_tokens, max=max(bb.max_length, graph.min_tokens + 1))
    args = (ids, mask) + ((types,) if graph.types else ())
    with warnings.catch_warnings(), torch.no_grad(), every_slot(graph), quiet_loggers():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(graph, args, str(path), dynamo=True, opset_version=OPSET, verbose=False,
                              input_names=graph.input_names, output_names=graph.output_names,
                              dynamic_shapes=tuple({0: batch, 1: tokens} for _ in args), report=False)
        except Exception as e:  # the exporter's own errors are many types; say which and stop
            if isinstance(e, OSError) or isinstance(e.__context__, OSError):  # a full disk: the CLI names the folder
                raise e if isinstance(e, OSError) else e.__context__ from None  # type: ignore[misc]
            raise ExportError(f"torch.onnx could not export the graph ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:400]})") from None


HEADS_KEY = "frozentune_heads"  # the graph's own record (metadata_props) of its heads' names and labels


def label_graph(path: Path, heads: list[dict]) -> None:
    """Record each head's name and labels, in order, in the graph file itself (ONNX metadata_props), which
    onnx.json's checksums cover: a label list edited in onnx.json alone (reordered: the same count) labelled
    the scores wrongly without a word; loading compares the two (OnnxClassifier). The weights stay where the
    export put them (external data is not loaded or moved)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    entry = model.metadata_props.add()
    entry.key, entry.value = HEADS_KEY, json.dumps(heads, ensure_ascii=False)
    onnx.save(model, str(path))


def session(path: Path, threads: int | None = None):
    """An ONNX Runtime CPU session of the graph (threads: intra-op threads, default ORT's)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def parity(graph: Graph, bb, path: Path) -> dict:
    """ONNX Runtime vs PyTorch on batches of CHECK_SHAPES: per output, the largest absolute
    difference and that difference relative to (1 + the output's largest magnitude)."""
    sess = session(path)
    absolute: dict[str, float] = {}
    relative: dict[str, float] = {}
    shapes = []
    for batch, tokens in CHECK_SHAPES:
        tokens = max(tokens, graph.min_tokens)
        ids, mask, types = example_inputs(bb, graph.sep is not None, batch, tokens, seed=batch)
        shapes.append(list(ids.shape))  # the tokenizer cuts at max_length: the shape that ran, not the one asked
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        if graph.types:
            feed["token_type_ids"] = types.numpy()
        with torch.no_grad():
            want = graph(ids, mask, types) if graph.types else graph(ids, mask)
        try:
            got = sess.run(graph.output_names, feed)
        except Exception as e:  # onnxruntime's own exception types
            raise ExportError(f"ONNX Runtime could not run the exported graph on a {batch}×{tokens} batch "
                              f"({' '.join(str(e).split())[:300]}); the graph was not written") from None
        for name, g, w in zip(graph.output_names, got, want):
            w = w.numpy()
            if g.shape != w.shape:
                raise ExportError(f"ONNX Runtime returned {name} of shape {g.shape} for a {batch}×{tokens} batch, "
                                  f"PyTorch {w.shape}: a dimension was fixed at export; the graph was not written")
            d = float(np.abs(g - w).max()) if w.size else 0.0
            absolute[name] = max(absolute.get(name, 0.0), d)
            relative[name] = max(relative.get(name, 0.0), d / (1.0 + float(np.abs(w).max()) if w.size else 1.0))
    return {"shapes": shapes, "max_abs": absolute, "relative": relative}


# ----------------------------------------------------------------------------- running it
META_KEYS = {"heads": list, "outputs": list, "inputs": list, "pairs": bool, "fields": list, "max_length": int}


def _read_meta(folder: Path) -> dict:
    """onnx.json, checked for what predict reads: an ExportError naming what is wrong, not a KeyError."""
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"--onnx {folder}: {META} is not valid JSON ({e}); restore it, or export again") from None
    bad = [k for k, kind in META_KEYS.items() if not isinstance(meta, dict) or not isinstance(meta.get(k), kind)]
    heads = meta.get("heads") if isinstance(meta, dict) else None
    if not bad and not all(isinstance(h, dict) and isinstance(h.get("name"), str) and isinstance(h.get("labels"), list)
                           and all(isinstance(x, str) for x in h["labels"]) for h in heads):
        bad = ["heads (each with a name and a list of labels)"]
    if bad:
        raise ExportError(f"--onnx {folder}: {META} lacks or has a wrong {', '.join(bad)}; restore it, or export again")
    return meta


class OnnxClassifier:
    """An exported folder, run with ONNX Runtime: tokenise as frozentune does, one session call per
    batch, softmax per head."""

    def __init__(self, folder: Path, threads: int | None = None):
        from transformers import AutoTokenizer

        from ..backbone import text_as_text

        folder = Path(folder)
        if not (folder / META).is_file() or not (folder / GRAPH).is_file():
            raise ExportError(f"--onnx {folder}: no {META} / {GRAPH}; give a folder written by "
                              f"`frozentune export --format onnx`")
        _require("onnxruntime", what="an ONNX graph (predict --onnx, onnx=True)")
        self.folder = folder
        self.meta = _read_meta(folder)
        again = "copy the whole folder written by `frozentune export --format onnx`, or export again"
        try:
            self.tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as e:  # transformers' own errors: a missing or damaged tokenizer file
            raise ExportError(f"--onnx {folder}: its tokenizer files cannot be read ({' '.join(str(e).split())[:200]}); "
                              f"{again}") from None
        text_as_text(self.tok)  # as the backbone reads texts (an export made before it was recorded)
        try:
            self.sess = session(folder / GRAPH, threads)
        except Exception as e:  # onnxruntime's own errors: e.g. model.onnx.data (its weights) left behind
            raise ExportError(f"--onnx {folder}: ONNX Runtime cannot load {GRAPH} ({' '.join(str(e).split())[:200]}); "
                              f"the graph's weights are in a file beside it (model.onnx.data): {again}") from None
        if isinstance(sums := self.meta.get("checksums"), dict) and sums != (now := graph_checksums(folder, list(sums))):
            changed = sorted(n for n in sums if sums[n] != now.get(n))  # a file beside them (a .bak copy) is not ours
            raise ExportError(f"--onnx {folder}: {', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'} "
                              f"from what the export wrote (checksums in {META}); {again}")
        graph_in = {i.name for i in self.sess.get_inputs()}
        widths = {o.name: o.shape[-1] for o in self.sess.get_outputs()}
        m = self.meta  # what predict reads of it, against the graph itself (an edit ended in a KeyError or ORT's error)
        wrong = [what for what, ok in (
            ("inputs (the graph's input names)", all(isinstance(x, str) for x in m["inputs"])
             and set(m["inputs"]) == graph_in),
            ("outputs (the graph's output names, every head's logits among them)",
             all(isinstance(x, str) and x in widths for x in m["outputs"])
             and all(f"{h['name']}.logits" in m["outputs"] for h in m["heads"])),
            ("heads (one or more, of distinct names)", 0 < len({h["name"] for h in m["heads"]}) == len(m["heads"])),
            ("max_length (2 tokens or more)", 2 <= m["max_length"] < 2 ** 31)) if not ok]
        if wrong:
            raise ExportError(f"--onnx {folder}: {META} has a wrong {'; '.join(wrong)}; {again}")
        for h in self.meta["heads"]:  # a label list edited apart from the graph would label the wrong scores
            if (n := widths.get(f"{h['name']}.logits")) != len(h["labels"]):
                raise ExportError(f"--onnx {folder}: {META} gives head {h['name']!r} {len(h['labels'])} labels, and the "
                                  f"graph's {h['name']}.logits has {n if n is not None else 'no such output'}; {again}")
        self._check_labels(again)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0

    def _check_labels(self, again: str) -> None:
        """onnx.json's heads and labels are the ones the graph records (label_graph); a graph exported before it
        recorded them (2026-11-29) is not checked."""
        recorded = self.sess.get_modelmeta().custom_metadata_map.get(HEADS_KEY)
        if recorded is None:
            return
        try:
            saved = {h["name"]: h["labels"] for h in json.loads(recorded)}
        except (ValueError, TypeError, KeyError):
            saved = None
        for h in self.meta["heads"]:
            had = saved.get(h["name"]) if isinstance(saved, dict) else None
            if had != h["labels"]:
                shown = json.dumps(h["labels"], ensure_ascii=False)[:80]
                raise ExportError(f"--onnx {self.folder}: {META} gives head {h['name']!r} the labels {shown}, but the "
                                  f"graph was exported with {json.dumps(had, ensure_ascii=False)[:80]}; a label list "
                                  f"edited apart from the graph labels the wrong scores: {again}")

    @property
    def pairs(self) -> bool:
        return bool(self.meta["pairs"])

    def run(self, texts: Sequence, batch_size: int = 32) -> dict[str, np.ndarray]:
        """Every output for `texts` (single texts, or (first, second) pairs for a pair model), in
        input order; per-token outputs padded to the longest text."""
        from ..api import given_texts

        return self._run(given_texts(texts), batch_size)[0]

    def _run(self, texts: Sequence, batch_size: int = 32) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(run's outputs, (N,) bool: which inputs went on past max_length, Tokenized.cut), for texts already
        checked by api.given_texts (run and predict check them: a list, nothing empty, as `predict --model` holds
        them)."""
        from ..backbone import tokenize
        from ..pairs import pair_kind

        if pair_kind(list(texts)) != self.pairs:
            raise ExportError(f"--onnx {self.folder}: the graph takes {'sentence pairs' if self.pairs else 'single texts'}; "
                              f"give {'--pair FIRST SECOND' if self.pairs else 'texts'}")
        tk = tokenize(self.tok, list(texts), int(self.meta["max_length"]))
        order = np.argsort(-tk.lengths, kind="stable")
        parts: dict[str, list] = {n: [None] * len(texts) for n in self.meta["outputs"]}
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            ids, mask, types = tk.padded(idx, self.pad)
            feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            if "token_type_ids" in self.meta["inputs"]:
                feed["token_type_ids"] = (types if types is not None else torch.zeros_like(ids)).numpy()
            for name, out in zip(self.meta["outputs"], self.sess.run(self.meta["outputs"], feed)):
                for j, i in enumerate(idx):
                    parts[name][i] = out[j]
        return {n: _stack(v) for n, v in parts.items()}, tk.cut

    def predict(self, texts: Sequence, log: Callable[[str], None] | None = None) -> list[dict]:
        """Per text: the text, and per head its label and per-label probabilities; "truncated": true
        where the text went on past max_length tokens (as `frozentune predict --model` says), counted in `log`."""
        from ..api import given_texts, labelled, text_row
        from ..backbone import cut_rows

        texts = given_texts(texts)
        out, cut = self._run(texts)
        cut = cut_rows(cut, int(self.meta["max_length"]), self.pairs, log)
        rows = []
        for i, t in enumerate(texts):
            tasks = {}
            for h in self.meta["heads"]:
                logits = out[f"{h['name']}.logits"][i]
                p = np.exp(logits - logits.max())
                tasks[h["name"]] = labelled(h["labels"], (p / p.sum()).tolist())
            row = {**text_row(t), "tasks": tasks} if len(tasks) > 1 else {**text_row(t), **next(iter(tasks.values()))}
            rows.append({**row, "truncated": True} if cut[i] else row)
        return rows


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """Rows of one output, padded with zeros along every axis to the largest."""
    shape = np.max([r.shape for r in rows], axis=0) if rows[0].ndim else ()
    out = np.zeros((len(rows), *shape), dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[(i, *(slice(0, n) for n in r.shape))] = r
    return out
