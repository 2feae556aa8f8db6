"""--precision fp32|bf16|fp16|int8: the frozen backbone's forward pass in a reduced precision,
and the per-device default (issue 16).

How each precision runs (chosen by measurement, see bench/precision_speed.py and the numbers below):

  fp32  the model as it is.
  bf16, fp16  torch.autocast(dtype=bfloat16 / float16) around a frozen copy: linear layers and
        attention in the reduced dtype (attention's softmax accumulates in fp32), LayerNorm and the
        residual stream in fp32. On CPUs fp16 has no matrix units: allowed, but ~4.5x slower than
        fp32 (measured). Against casting the whole model (`model.to(bfloat16)`), autocast halves the states' error at
        the same speed (MiniLM, 200 SST-2 test sentences, per-token relative L2 error vs fp32, mean /
        max: layer 4 0.45% / 0.78% vs 0.81% / 1.33%; last layer 0.68% / 2.0% vs 1.17% / 2.7%).
  int8  every nn.Linear replaced by `Int8Linear`: weights int8 per output channel (symmetric),
        activations quantised per token at run time (asymmetric, 256 levels), the product in
        int32 by torch's own `torch._int_mm` (oneDNN: VNNI where the CPU has it), rescaled to fp32;
        attention, LayerNorm and GELU stay fp32. CPU only.

  Why not a library for int8 (measured on MiniLM, 1 thread, AVX-512 VNNI CPU, 2,000 SST-2 train
  texts; errors on 200 SST-2 test sentences, mean per-token relative L2 error layer 4 / last):
    torch.ao.quantization.quantize_dynamic (fbgemm): 2.5x fp32 but 35% / 42% error (activations are
      quantised with one scale per *tensor*, 7 bits: MiniLM's outlier tokens and channels crush
      every other value; a text's states even depend on the other texts of its batch), -2.2
      accuracy points of an SST-2 probe trained on fp32 states; and it warns (DeprecationWarning)
      "torch.ao.quantization is deprecated and will be removed in 2.10" (still there in 2.13).
    ONNX Runtime quantize_dynamic (1.32): 2.3x fp32, 28% / 33% error (12% / 16% per-channel
      weights): the same per-tensor activation scale; plus an ONNX export and a wrapper.
    torchao 0.18 Int8DynamicActivationInt8WeightConfig (per-token, like Int8Linear): the same error
      as Int8Linear with symmetric activations (5.1% / 8.0%), but only 1.1-1.25x fp32 in eager mode
      (its rescaling makes ~10 passes over each output; fast only under torch.compile, which needs a
      C++ compiler and recompiles per shape); a new dependency whose wheels target other torch builds.
    Int8Linear: 1.8x fp32 natively in the same run (1.9x / 1.55x on SST-2 / IMDB in
      bench/precision_speed.py), error 3.7% / 5.5% (asymmetric activations: GELU's output is nearly
      non-negative, so a symmetric range wastes half its levels; symmetric 5.1% / 8.0%). Quantising
      per token also keeps a text's states independent of the other texts in its batch.
  (The library comparisons were measured with throwaway scripts, not kept: torchao, onnxruntime and
  onnx are not dependencies of the project.) An SST-2 probe trained on fp32 mean-pooled states moved
  by 0.0 points on bf16 states and by 0.5-0.7 (8-bit weights) or 0.2-1.0 (7-bit) on int8 states.

  Without VNNI (AVX2 only, and AVX-512 CPUs before Cascade Lake) oneDNN's int8 product adds pairs
  of u8·s8 products in int16 and saturates when weights use the full int8 range (measured: wrong by
  up to 9e5 on a 384-term product under ONEDNN_MAX_CPU_ISA=AVX2). `int8_weight_levels` checks the
  product once per process on worst-case values and uses 7-bit weights (±63, exact there) when
  8-bit ones are not exact: the states' error is then 5.7% / 7.9%.

  That AVX2 was an AVX-512 CPU held to AVX2 by environment variables, and it was no measurement of a CPU
  that has AVX2 only. On one (an AMD EPYC without AVX-512 or VNNI, a machine of this project's kind),
  torch._int_mm is exact with 8-bit weights (3.6% / 5.5%) but runs a slow kernel: int8 0.03x fp32's tokens/s,
  bf16 0.13x / 0.15x, fp16 0.15x / 0.16x (bench/results/precision_speed-avx2-native.json). So the speed of a
  reduced precision is measured on the CPU at hand when one is chosen (speed_vs_fp32), and said when it is
  slower than fp32 (slow_note).
"""
from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor, nn

from ..backbone import device_of
from .device import cpu_features, native_bf16
from .errors import ExtractError

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HELP = ("fp32 (exact), bf16 or fp16 (autocast: matrix products in 16 bits, norms in fp32), "
        "int8 (CPU only: dynamic int8 linear layers)")


# ----------------------------------------------------------------------------- checks and defaults
def _autocast_available(device_type: str) -> bool:
    check = getattr(torch.amp, "is_autocast_available", None)
    return bool(check(device_type)) if check is not None else device_type in ("cpu", "cuda")


def check_precision(precision: str, device: torch.device) -> None:
    """ExtractError for an unknown precision or one that cannot run on `device`; the message says
    what to use instead. Does not check that the device exists (resolve_device does)."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ExtractError(f"--precision {precision!r}: give one of {HELP}, or leave it out for the "
                           f"device's default")
    if precision == "int8":
        if device.type != "cpu":
            other = "bf16 or fp16" if device.type == "cuda" else "fp16 or fp32"
            raise ExtractError(f"--precision int8 runs on the CPU only (dynamic int8 linear layers of torch's "
                               f"CPU backend); on {device} use --precision {other}, or --device cpu for int8")
        if int8_weight_levels() == 0:
            raise ExtractError("--precision int8: this CPU's int8 matrix product (torch._int_mm) is not exact "
                               "even for 7-bit weights, so int8 states would be wrong here; use --precision fp32 "
                               "(or bf16)")
        return
    if precision in ("bf16", "fp16"):
        if not _autocast_available(device.type):
            raise ExtractError(f"--precision {precision}: this torch ({torch.__version__}) has no mixed precision "
                               f"(autocast) on {device.type}; use --precision fp32")
        if (precision == "bf16" and device.type == "cuda" and torch.cuda.is_available()
                and not torch.cuda.is_bf16_supported()):
            raise ExtractError(f"--precision bf16: this GPU ({torch.cuda.get_device_name(device)}) has no bf16 "
                               f"support; use --precision fp16 (or fp32)")


def default_precision(device: torch.device) -> tuple[str, str]:
    """(precision, one-line reason) for `device`.

    CPU: measured with MiniLM, 1 thread, as extraction runs (length-sorted batches of ≤ 8,192
    tokens); median over 3 interleaved rounds of tokens/s as a ratio to fp32 of the same round,
    SST-2 (4,000 train texts, 53k tokens) / IMDB (250 reviews at max_length 256, 52k tokens); state
    error: per-token relative L2 error vs fp32 on 200 SST-2 test sentences, mean (layer 4 / last).

      python bench/precision_speed.py --threads 1 --repeats 3 --imdb 250
          → bench/results/precision_speed.json (AMD EPYC, AVX-512 BF16 + VNNI):
          bf16 1.73x / 1.90x (0.45% / 0.68%), int8 1.94x / 1.55x (3.7% / 5.5%), fp16 0.22x / 0.23x
      ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python bench/precision_speed.py --threads 1 --repeats 3 --imdb 250 --small fp16,bf16 \
          --out bench/results/precision_speed-avx2.json   (the same CPU limited to AVX2):
          bf16 0.22x / 0.24x, fp16 0.22x / 0.22x, int8 1.39x / 1.17x (5.7% / 7.9%: 7-bit weights)

      python bench/precision_speed.py --threads 1 --repeats 3 --imdb 250 --small fp16,bf16,int8 \
          --out bench/results/precision_speed-avx2-native.json   (AMD EPYC with AVX2 only, no VNNI):
          bf16 0.13x / 0.15x, fp16 0.15x / 0.16x, int8 0.03x / 0.03x (3.6% / 5.5%)

    Native bf16 → bf16: as fast as int8 on short texts and faster on long ones, with 1/8 of its error.
    Other x86 CPUs → fp32: bf16/fp16 are emulated (4-8x slower); int8 was 1.2-1.4x on the AVX-512
    CPU held to AVX2 and 30x slower on the AVX2-only one, with states 4-8% off, which moved an SST-2
    probe trained on fp32 states by up to 1 point (goal 0.5): a default should not cost accuracy for
    that. --precision int8 to choose it (its speed here is then measured and said).
    CUDA → bf16 where supported (fp32's range, so no overflow), else fp16; both autocast, norms in
    fp32. MPS → fp32 (not measured: see the reason).
    """
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return "fp16", "this GPU has no bf16: fp16 autocast (tensor cores, norms in fp32)"
        return "bf16", "GPU tensor cores at 16 bits; bf16 keeps fp32's range (no overflow), norms stay fp32"
    if device.type == "mps":
        return "fp32", ("not measured on Apple GPUs, whose fp16 rate is close to fp32's while MPS autocast "
                        "coverage varies with macOS/torch; --precision fp16 to try it")
    if device.type != "cpu":
        return "fp32", f"no measurement of reduced precision on {device.type}"
    if native_bf16():
        return "bf16", BF16_WHY
    if _x86_avx2():
        return AVX2_CHOICE, AVX2_WHY
    return "fp32", "no measurement of reduced precision on this CPU type (no AVX2): fp32 is exact"


# From bench/results/precision_speed*.json (see default_precision's docstring).
BF16_WHY = ("CPU with native bf16: measured 1.7-1.9x fp32, states off by 0.5-0.7% on average (int8: "
            "1.5-1.9x, states ~4-5% off)")
AVX2_CHOICE = "fp32"
AVX2_WHY = ("CPU without native bf16: bf16/fp16 are emulated (measured 4-8x slower); int8 moves the states 4-8% "
            "and its speed differs between CPUs (measured 0.03-1.4x fp32): --precision int8 measures it here")


# A reduced precision whose matrix product runs below this fraction of fp32's speed on this CPU is said to
# make the pass slower. Measured once per process (speed_vs_fp32): CPUs of one kind differ here. On an AMD EPYC
# with AVX2 only (no VNNI, no AVX-512 BF16), (256 x 384)·(384 x 1536), 1 thread: fp32 6.5 ms, torch._int_mm
# 420 ms (65x slower), bf16 455 ms; bench/precision_speed.py on that CPU: int8 0.03x, bf16 0.13x fp32.
SLOWER = 0.5


@functools.lru_cache(maxsize=None)
def speed_vs_fp32(precision: str) -> float:
    """How fast this CPU multiplies matrices in `precision` as a ratio to fp32 (above 1: faster), measured
    now and once per process, at torch's current thread count: (128 x 384)·(384 x 1536), the shape of
    MiniLM's feed-forward up-projection over 128 tokens, best of 3 after a warm-up. bf16/fp16: the product
    of tensors of that dtype (what autocast runs); int8: torch._int_mm, as Int8Linear runs it. Takes
    ~10 ms where the precision is fast, up to ~1 s where it is slow."""
    import timeit

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 384, generator=g), torch.randn(384, 1536, generator=g)
    if precision == "int8":
        ai, bi = (a * 20).clamp(-127, 127).to(torch.int8), (b * 20).clamp(-127, 127).to(torch.int8)
        run = functools.partial(torch._int_mm, ai, bi)
    else:
        run = functools.partial(torch.matmul, a.to(DTYPES[precision]), b.to(DTYPES[precision]))

    def best(f) -> float:
        f()  # the warm-up
        return min(timeit.repeat(f, number=1, repeat=3))

    return best(functools.partial(torch.matmul, a, b)) / max(best(run), 1e-9)


def slow_note(precision: str, device: torch.device) -> str | None:
    """What to say when `precision` would make the CPU pass slower than fp32 here (speed_vs_fp32 below SLOWER):
    a user who chose int8 or bf16 for speed, or a model trained on bf16 states on a CPU that has bf16
    instructions and then run on one that has not, got a pass many times slower and no word of it. None
    on other devices, for fp32, and where the precision is not slower."""
    if torch.device(device).type != "cpu" or precision == "fp32":
        return None
    ratio = speed_vs_fp32(precision)
    if ratio >= SLOWER:
        return None
    times = f"{1 / ratio:.1f}" if ratio > 0.1 else f"{1 / ratio:.0f}"
    return (f"on this CPU a matrix product in {precision} ran {times}x slower than in fp32 (measured just now): "
            f"it will run slower, not faster; --precision fp32 is exact and faster here")


def slow_suffix(precision: str, device: torch.device) -> str:
    """"; <slow_note>" to end a line saying the precision, or "" where it is not slower (every such line: the
    backbone pass's runtime and decoding's)."""
    note = slow_note(precision, device)
    return f"; {note}" if note else ""


def _x86_avx2() -> bool:
    f = cpu_features()
    return bool(f["avx2"]) and str(f["capability"]).startswith(("AVX2", "AVX512"))


# ----------------------------------------------------------------------------- preparing the model
def _frozen_copy(model: nn.Module, device: torch.device) -> nn.Module:
    c = copy.deepcopy(model).to(device)
    c.eval()
    for p in c.parameters():
        p.requires_grad_(False)
    return c


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        cur = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return (a.index if a.index is not None else cur) == (b.index if b.index is not None else cur)
    return True


class AutocastModel(nn.Module):
    """`model` run under torch.autocast(device, dtype): same call signature and output object."""

    def __init__(self, model: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device_type, dtype
        self.config = getattr(model, "config", None)

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            return self.model(*args, **kwargs)


def prepare(model: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """A frozen module in eval mode on `device` computing what `model` computes, in `precision`;
    called like the Hugging Face model (input_ids=, attention_mask=, output_hidden_states=) and
    returning its output object (states in fp32, or in the reduced dtype: the caller casts).

    fp32 on the model's own device returns `model` itself when it is already frozen (eval mode, no
    parameter requiring grad); every other case returns a copy, never modifying `model`."""
    device = torch.device(device)
    check_precision(precision, device)
    if precision == "fp32":
        frozen = not model.training and not any(p.requires_grad for p in model.parameters())
        if frozen and _same_device(device_of(model), device):
            return model
        return _frozen_copy(model, device)
    if precision in ("bf16", "fp16"):
        copy_ = _frozen_copy(model, device)
        for m in copy_.modules():  # autocast would cast these weights on every call; once is enough and
            if isinstance(m, nn.Linear):  # gives the same products (on a quiet run 1.85x → 1.87x fp32 on SST-2,
                m.to(DTYPES[precision])  # identical states; bench/bf16_linears.py)
        return AutocastModel(copy_, device.type, DTYPES[precision]).eval()
    return quantize_int8(model)


# ----------------------------------------------------------------------------- int8
@functools.lru_cache(maxsize=1)
def int8_weight_levels() -> int:
    """127 when torch._int_mm is exact for full-range int8 operands here (VNNI/AMX or a reference
    kernel), 63 when it is exact only for 7-bit weights (the int16 pair sums of AVX2 / AVX-512 without
    VNNI saturate at 2·255·127 > 32767 but not at 2·255·63), 0 when neither is exact.

    The check multiplies worst-case operands (half of the activations at the extremes ±128/127,
    weights all ±levels) and compares with the exact int64 product; it takes milliseconds."""
    g = torch.Generator().manual_seed(0)
    for levels in (127, 63):
        ok = True
        for m, k, n in ((64, 384, 64), (3, 32, 16)):
            a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
            ext = torch.where(torch.rand(m, k, generator=g) < 0.5, 127, -128).to(torch.int8)
            a = torch.where(torch.rand(m, k, generator=g) < 0.5, ext, a)
            b = ((torch.randint(0, 2, (k, n), generator=g) * 2 - 1) * levels).to(torch.int8)
            try:
                got = torch._int_mm(a, b)
            except RuntimeError:
                return 0
            ok = ok and torch.equal(got.long(), a.long() @ b.long())
        if ok:
            return levels
    return 0


class Int8Linear(nn.Module):
    """y = x·Wᵀ + b with W int8 per output channel (symmetric, `levels` = 127 or 63) and x quantised
    per row at run time to 256 levels (asymmetric: scale (max−min)/255 and an integer zero point,
    both including 0), the product exact in int32 (torch._int_mm), rescaled to fp32:

        x ≈ sx·(q + 128 − z),  q ∈ [−128, 127]  →  y = sx·sw·(q·Wq) + sx·(128 − z)·(sw·ΣWq) + b
    """

    def __init__(self, linear: nn.Linear, levels: int = 127):
        super().__init__()
        w = linear.weight.detach().float()
        sw = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / levels
        wq = (w / sw[:, None]).round().clamp(-levels, levels).to(torch.int8)
        self.in_features, self.out_features, self.levels = linear.in_features, linear.out_features, levels
        self.register_buffer("wq", wq.t().contiguous())  # (in, out) for _int_mm
        self.register_buffer("sw", sw)
        self.register_buffer("colsum", wq.float().sum(1) * sw)  # Σ_k Wq[j,k]·sw[j]: the zero-point term
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.register_buffer("bias", bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight_levels=±{self.levels}"

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()
        if x.shape[0] == 0:
            return x.new_zeros(*shape[:-1], self.out_features)
        lo = x.amin(1, keepdim=True).clamp_max(0)
        hi = x.amax(1, keepdim=True).clamp_min(0)
        sx = (hi - lo).div_(255).clamp_min_(torch.finfo(torch.float32).tiny)
        z = (-lo / sx).round_()  # zero point: the level of 0.0, in [0, 255]
        q = (x / sx).round_().add_(z - 128).clamp_(-128, 127).to(torch.int8)
        out = torch._int_mm(q, self.wq).float()
        out.mul_(sx).mul_(self.sw)
        # + sx·(128 − z)·colsum + bias as one rank-2 update
        out.addmm_(torch.cat([sx * (128 - z), torch.ones_like(sx)], 1), torch.stack([self.colsum, self.bias]))
        return out.reshape(*shape[:-1], self.out_features)


def quantize_int8(model: nn.Module) -> nn.Module:
    """A frozen CPU copy of `model` with every nn.Linear an Int8Linear."""
    levels = int8_weight_levels()
    c = _frozen_copy(model, torch.device("cpu"))
    for parent in list(c.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child, levels))
    return c.eval()
