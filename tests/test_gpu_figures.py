"""Every GPU figure a lesson types is traceable: read from the reference in a code cell, or labelled.

A *GPU figure* is a number in a lesson's text (markdown, and the strings and comments of code cells)
that sits in a paragraph naming a GPU (H100, A100, T4, MI300, a TPU v5e, or just "GPU"), or right after
one (the paragraph before, or the last paragraph of the markdown cell before), and carries
a GPU unit (TFLOP/s, GB/s, ms, µs, MiB, GiB, a speed-up "3.6x" or "7 times", a percentage), is joined
to such a number ("12.2 → 2.3 ms", "7.7 to 11.4 ms", "4270 and 3010 MiB"), or is a decimal or a
thousands-separated number there ("TF32 28.0"); or a number within a few words of a GPU model's name
("the H100 SXM5 has 132 SMs"). Not figures: years, lesson, section, exercise and point numbers, batch
sizes and image sizes ("batch 128", "224x224", "n = 4096", "2^20"), dtypes and names ("float16",
"H100"), versions, counts of devices ("8 GPUs"), size multipliers ("4x the batch"), the size of the work
("copies of 64 MiB", "4 MiB per tensor"), unitless numbers in inline code, and whatever a code cell
computes at run time (an f-string's ``{...}`` fields are not text).

Each figure must sit in a sentence labelled with where it comes from:

- ``predicted`` (a model's prediction, not a measurement);
- ``vendor spec`` / ``vendor's spec`` / ``datasheet`` (the hardware maker's number);
- ``published`` with a link to where, in the same sentence (a paper's own figure, e.g. PaLM's MFU);
- ``recorded`` or ``measured`` with ``(reference key `name`)``, ``name`` a measurement of the shipped
  reference (``src/gpucourse/reference/h100.json``). Such a figure must also *be* in that entry: a
  value of it (a TFLOP/s figure may be quoted in GFLOP/s, a ms one in µs), a ratio of two of its values
  (for "x", "times" and "%"), or a number its description states, at the precision the text shows.

The CUDA-graph probe's "float32" rows ran cuDNN's TF32 convolutions (the errata of the 2026-11-25 H100
run): a sentence quoting them as float32 must also say TF32.

A lesson whose text another change is rewriting can be listed in NOT_YET (xfail, not strict) with
the sentences that failed, until its text is labelled too.
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
REFERENCE = ROOT / "src" / "gpucourse" / "reference" / "h100.json"

GPU_MODEL = r"(?:[HAVB]100|H200|B200|GB200|T4|L4|A10G?|A6000|MI\d{3}X?|TPU\s?v\d+\w*(?:-\d+)?)"
GPU_WORD = re.compile(rf"\b(?:{GPU_MODEL}|GPUs?|TPUs?)\b")
GPU_MODEL_RE = re.compile(rf"\b{GPU_MODEL}(?:\s+(?:80GB|PCIe|SXM\d?|NVL|HBM3e?))*\b")
# The unit right after a number ("47.0 ms", "3.6x", "51 GB/s", "2.9 to 7.1 times", "0.2%").
UNIT = (r"(?:(?:[TGPM]FLOP/s|FLOP/B|FLOP per byte|[TGMK]B/s|ms|[µμu]s|ns|[KMGT]iB|[MGT]B|times|seconds?|milliseconds?"
        r"|microseconds?)(?![\w/])|%|(?:x|×)(?!\w|\s*\d))")
NUMBER = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
# A number: not glued to a name (fp32, H100, b128, sm_80), an exponent (2^20) or a shape (224x224).
NUM = rf"(?<![\w.^/])(?<![A-Za-z_]-){NUMBER}(?![^\Wx]|x\w|\^|\.\d|/\d)"
CONNECT = r"\s*(?:-|–|—|→|->|to|against|vs\.?|and|or|/|,)\s*"
WITH_UNIT = re.compile(rf"(?P<run>{NUM}(?:{CONNECT}{NUM})*)\s?(?P<unit>{UNIT})")
ANY_NUM = re.compile(NUM)
# Numbers that are never GPU figures, by the words before or after them.
NOT_A_FIGURE_BEFORE = re.compile(
    r"(?:\b(?:lessons?|sections?|exercises?|questions?|cells?|steps?|epochs?|batch(?:es)?(?: of)?|n|size|sizes"
    r"|rank|ranks|GPU|node|nodes|line|lines|chapter|part|q|torch|PyTorch|XLA|CUDA|Python|cuDNN|cuBLAS|NCCL|driver|version"
    r"|capability|sm|compute capability|Lightning|Darts|Triton|JAX|TensorFlow|arXiv|v|figure|table|seed|top)\s*[=:]?\s*|[#^*/x×]\s?|==)$",
    re.IGNORECASE)
NOT_A_FIGURE_AFTER = re.compile(
    r"^(?:\s*(?:points?|bits?|GPUs?|TPUs?|nodes?|processes|ranks?|workers?|threads?|cores?|layers?|images?|elements?"
    r"|floats?|channels?|epochs?|steps?|batches|items?|samples?|tokens?|classes|filters?|rows?|columns?|parameters?"
    r"|weights?|copies|launches?|kernels?|calls?|operations?|ops?"
    r"|(?:x|times) (?:the |as many )?(?:batch|pixels|images|data|size|elements|bytes|work)|\s*\*|\.x\b|-bit|-byte"
    r"|\s*\))|\s*x\s*\d|px|-dim)", re.IGNORECASE)
YEAR = re.compile(r"^(?:19|20)\d\d$")
LABELS = re.compile(r"\bpredict(?:ed|s|ion)\b|\bvendor(?:'s|s')? spec|\bdatasheet\b", re.IGNORECASE)
PUBLISHED = re.compile(r"\bpublished\b", re.IGNORECASE)  # with a link (LINK) to where, in the same sentence
LINK = re.compile(r"\]\(https?://[^)\s]+\)")
KEYED = re.compile(r"\b(?:recorded|measured)\b.*?\breference keys? (?P<keys>`[a-z0-9_]+`(?:(?:,\s*|\s+and\s+)`[a-z0-9_]+`)*)",
                   re.IGNORECASE | re.DOTALL)
KEY = re.compile(r"`([a-z0-9_]+)`")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[`_])|\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)|\n(?=\|)")
SIZE_MULTIPLIER = re.compile(r"\s?(?:x|×|times)\s+(?:the|as many|as much)\s+(?:batch|pixels|images|data|size|elements|bytes|work|other)")
MULTIPLIERS = ("x", "×", "times")
BYTES = ("KiB", "MiB", "GiB", "MB", "GB")
WORKLOAD_BEFORE = re.compile(r"\b(?:cop(?:y|ies|ying)|tensors?|buffers?|messages?|all-reduces?) of (?:S = )?$|\bS = $")
WORKLOAD_AFTER = re.compile(r"\s*(?:per tensor|each|buffers?\b|messages?\b|tensors?\b)")
MODEL_REACH = 6  # words: a number this close to a GPU model's name is about that GPU


@dataclass(frozen=True)
class Figure:
    """A number found in a GPU context: the number as typed, its unit ("" when none), its sentence."""

    number: str
    unit: str
    sentence: str


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, and each list item or table row on its own."""
    return [p for p in re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)|\n(?=\|)", text) if p.strip()]


def _sentences(paragraph: str) -> list[str]:
    return [s for s in SENTENCE_END.split(paragraph) if s and s.strip()]


def _excluded(sentence: str, start: int, end: int) -> bool:
    number = sentence[start:end]
    if YEAR.match(number):
        return True
    if not sentence[:start].strip() and sentence[end:end + 2] in (". ", ") "):
        return True  # a numbered list's item
    return bool(NOT_A_FIGURE_BEFORE.search(sentence[max(0, start - 30):start])
                or NOT_A_FIGURE_AFTER.match(sentence[end:end + 40]))


def _blank_links(text: str) -> str:
    """Links keep their length as blanks (a URL's digits are not figures)."""
    def blank(match: re.Match) -> str:
        return " " * len(match.group(0))

    return re.sub(r"https?://\S+", blank, re.sub(r"\]\([^)]*\)", blank, text))


def figures_in(text: str, context: str = "") -> list[Figure]:
    """The GPU figures of one piece of prose (a markdown cell, a string or a comment of a code cell).
    ``context`` is the paragraph before the text (the end of the previous markdown cell)."""
    found = []
    paragraphs = _paragraphs(text)
    for before, paragraph in zip([context] + paragraphs, paragraphs):
        if not GPU_WORD.search(_blank_links(before + "\n" + paragraph)):
            continue  # a GPU named in this paragraph or the one before it
        for sentence in _sentences(paragraph):
            plain = _blank_links(sentence)
            models = [m.span() for m in GPU_MODEL_RE.finditer(plain)]
            for m in models:  # a model's own digits are its name
                plain = plain[:m[0]] + " " * (m[1] - m[0]) + plain[m[1]:]
            spans: dict[tuple[int, int], str] = {}
            code_spans = [m.span() for m in re.finditer(r"`[^`\n]*`", plain)]
            for run in WITH_UNIT.finditer(plain):
                numbers = list(ANY_NUM.finditer(run.group("run")))
                for i, n in enumerate(numbers):
                    start, end = run.start("run") + n.start(), run.start("run") + n.end()
                    if i < len(numbers) - 1 and _excluded(plain, start, end):
                        continue  # "at batch 128 and 9.9 ms": 128 is the batch, joined by "and" only
                    spans[(start, end)] = run.group("unit")
            for n in ANY_NUM.finditer(plain):
                span = n.span()
                if span in spans:
                    continue
                typed = n.group(0)
                words_from_model = min((len(plain[min(a, span[0]):max(b, span[1])].split())
                                        for a, b in models), default=MODEL_REACH + 1)
                if "." in typed or "," in typed or words_from_model <= MODEL_REACH:
                    spans[span] = ""
            for (start, end), unit in sorted(spans.items()):
                after_unit = plain[end:].lstrip(" ")[len(unit):]
                if unit in BYTES and (WORKLOAD_BEFORE.search(plain[max(0, start - 30):start])
                                      or WORKLOAD_AFTER.match(after_unit[:20])):
                    continue  # "copies of 64 MiB", "4 MiB per tensor": the size of the work, like a batch size
                if unit in MULTIPLIERS and SIZE_MULTIPLIER.match(plain[end:end + 40]):
                    continue  # "4x the batch": a size, not a speed
                if unit == "%" and _value(plain[start:end]) in (0, 100):
                    continue  # "below 100%": a bound, not a figure
                if unit in ("", *MULTIPLIERS) and _excluded(plain, start, end):
                    continue
                if not unit and any(a < start < b for a, b in code_spans):
                    continue  # `cuda:1`, `"2,3"`, `==0.10`: code, not a figure (a figure with its unit still counts)
                found.append(Figure(sentence[start:end], unit, " ".join(sentence.split())))
    return found


def _rounds_to(shown: str, true: float) -> bool:
    """Whether ``true`` is ``shown`` at the precision shown: its decimals, or its significant digits."""
    value = _value(shown)
    digits = shown.replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    if abs(true - value) <= 0.5 * 10 ** -decimals * (1 + 1e-9):  # half a unit of the last digit shown
        return True
    if "." not in digits:  # "430" or "52,000": trailing zeros are not significant
        significant = len(digits.rstrip("0")) or 1
        scale = 10 ** (len(digits) - significant)
        return abs(true - value) <= 0.5 * scale * (1 + 1e-9)
    return False


SCALE = {("TFLOP/s", "GFLOP/s"): 1000, ("ms", "µs"): 1000, ("ms", "μs"): 1000, ("ms", "us"): 1000,
         ("µs", "ms"): 1e-3, ("MiB", "GiB"): 1 / 1024, ("TFLOP/s", "TFLOP/s"): 1}


def _stated_numbers(entry: dict) -> list[tuple[float, str]]:
    """Numbers the entry's description states, with the unit after each ("2990 MiB", "1.28 GiB")."""
    text = " ".join(str(entry.get(k, "")) for k in ("what", "method")) + " " + " ".join(entry.get("recipe", {}).values())
    return [(_value(m.group(1)), m.group(2) or "") for m in re.finditer(rf"({NUMBER})\s?({UNIT})?", text)]


def comparable(label: str, other: str) -> bool:
    """Whether a ratio of two values of one entry means something: the same workload size ("b128 224px",
    "8192") in another recipe, or the same recipe at another size."""
    def sized(words: str) -> tuple[set[str], set[str]]:
        size = {w for w in words.split() if re.fullmatch(r"b?\d+(?:px|GiB)?", w)}
        return size, set(words.split()) - size

    (size, recipe), (other_size, other_recipe) = sized(label), sized(other)
    return size == other_size or recipe == other_recipe


def traced_by(figure: Figure, entry: dict) -> bool:
    """Whether a figure is in a reference entry: a value (in its unit or a scaled one), a ratio of two
    values (x, times, %), or a number its description states."""
    values = list(entry["values"].values())
    unit = entry["unit"]
    ratios = [a / b for (x, a), (y, b) in itertools.permutations(entry["values"].items(), 2) if b and comparable(x, y)]
    if figure.unit in MULTIPLIERS:
        candidates = ratios
    elif not figure.unit:
        candidates = ratios + values
    elif figure.unit == "%":
        candidates = [100 * r for r in ratios] + [100 * (1 - r) for r in ratios]
    else:
        scale = SCALE.get((unit, figure.unit), 1 if figure.unit == unit else None)
        candidates = [v * scale for v in values] if scale else []
    candidates += [n for n, u in _stated_numbers(entry) if u in (figure.unit, "") or not figure.unit]
    return any(_rounds_to(figure.number, c) for c in candidates)


def problems_of(figure: Figure, measurements: dict) -> str | None:
    """Why a figure is not traceable, or None."""
    if LABELS.search(figure.sentence) or (PUBLISHED.search(figure.sentence) and LINK.search(figure.sentence)):
        return None
    keyed = list(KEYED.finditer(figure.sentence))
    if not keyed:
        return "no label: read it from the reference in a code cell, or label it predicted, vendor spec, or recorded (reference key `...`)"
    keys = [k for m in keyed for k in KEY.findall(m.group("keys"))]
    unknown = [k for k in keys if k not in measurements]
    if unknown:
        return f"reference key {', '.join(unknown)} is not a measurement of {REFERENCE.name}"
    if not any(traced_by(figure, measurements[k]) for k in keys):
        return f"{figure.number} {figure.unit} is not a value, ratio or stated number of {', '.join(keys)}"
    return None


def notebook_texts(path: Path) -> list[tuple[str, str, str]]:
    """(where, text, context) for every markdown cell (its context: the last paragraph of the markdown
    cell before it), and every string and comment of every code cell (no context)."""
    nb = json.loads(path.read_text())
    texts, last_paragraph = [], ""
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        where = f"{path.parent.name} cell {index} ({cell.get('id')})"
        if cell["cell_type"] == "markdown":
            texts.append((where, source, last_paragraph))
            last_paragraph = (_paragraphs(source) or [""])[-1]
        elif cell["cell_type"] == "code":
            texts += [(where, text, "") for text in code_texts(source)]
    return texts


def code_texts(source: str) -> list[str]:
    """The prose of a code cell: string literals (an f-string's fields left out) and comment blocks."""
    runnable = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    texts: list[str] = []
    try:
        tree = ast.parse(runnable)
    except SyntaxError:
        return [source]  # not Python: all of it is text
    inside_fstring = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
            inside_fstring.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstring:
            texts.append(node.value)
    block: list[str] = []  # consecutive whole-line comments are one text; a comment after code is its own
    for token in tokenize.generate_tokens(io.StringIO(runnable).readline):
        if token.type == tokenize.COMMENT and token.line[:token.start[1]].strip():
            texts.append(token.string.lstrip("#").strip())
        elif token.type == tokenize.COMMENT:
            block.append(token.string.lstrip("#").strip())
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) and block:
            texts.append(" ".join(block))
            block = []
    if block:
        texts.append(" ".join(block))
    return texts


def untraceable(path: Path, measurements: dict) -> list[str]:
    """Each GPU figure of a notebook that is not traceable: where, the number, why, the sentence."""
    found = []
    for where, text, context in notebook_texts(path):
        for figure in figures_in(text, context):
            why = problems_of(figure, measurements)
            if why:
                found.append(f"{where}: {figure.number} {figure.unit}: {why}\n    {figure.sentence[:400]}")
    return found


MEASUREMENTS = json.loads(REFERENCE.read_text())["measurements"]
# Lessons whose text another change is rewriting, with the sentences that failed when this was written.
NOT_YET: dict[str, str] = {}


def _params():
    for path in sorted(SOLUTIONS.glob("*/*.ipynb")):
        reason = NOT_YET.get(path.parent.name)
        marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
        yield pytest.param(path, marks=marks, id=path.parent.name)


@pytest.mark.parametrize("path", list(_params()))
def test_every_gpu_figure_is_read_from_the_reference_or_labelled(path):
    found = untraceable(path, MEASUREMENTS)
    assert not found, f"{len(found)} GPU figure(s) without a source:\n" + "\n".join(found)


# The errata of the 2026-11-25 H100 run: the CUDA-graph probe left cuDNN's TF32 on (allow_tf32 defaults to
# True), so its "fp32" rows ran TF32 convolutions; a sentence quoting them as float32 must say so.
RECIPE_WORDS = {"resnet18_cuda_graph_ms": (re.compile(r"\b(?:float32|fp32)\b"), re.compile(r"\bTF32\b"))}


def mislabelled(path: Path) -> list[str]:
    """Sentences that quote a reference entry under a recipe its errata correct (float32 for TF32)."""
    found = []
    for where, text, context in notebook_texts(path):
        for paragraph in _paragraphs(text):
            for sentence in _sentences(paragraph):
                keys = [k for m in KEYED.finditer(sentence) for k in KEY.findall(m.group("keys"))]
                for key in keys:
                    named, required = RECIPE_WORDS.get(key, (None, None))
                    if named and named.search(sentence) and not required.search(sentence):
                        found.append(f"{where}: quotes {key} as float32 without TF32:\n    {' '.join(sentence.split())[:300]}")
    return found


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("*/*.ipynb")), ids=lambda p: p.parent.name)
def test_figures_quoted_from_the_cuda_graph_probe_say_tf32(path):
    found = mislabelled(path)
    assert not found, "\n".join(found)


def test_a_cuda_graph_figure_called_plain_float32_is_mislabelled(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "id": "x", "metadata": {}, "source": [
        "Recorded on the H100 (reference key `resnet18_cuda_graph_ms`): float32 12.2 → 2.3 ms."]}]}
    (tmp_path / "lesson99").mkdir()
    (tmp_path / "lesson99" / "x.ipynb").write_text(json.dumps(nb))
    assert mislabelled(tmp_path / "lesson99" / "x.ipynb")
    nb["cells"][0]["source"] = ["Recorded on the H100 (reference key `resnet18_cuda_graph_ms`): float32 weights, "
                                "TF32 convolutions, 12.2 → 2.3 ms."]
    (tmp_path / "lesson99" / "x.ipynb").write_text(json.dumps(nb))
    assert not mislabelled(tmp_path / "lesson99" / "x.ipynb")
    assert not untraceable(tmp_path / "lesson99" / "x.ipynb", MEASUREMENTS)


# --- the detector itself -------------------------------------------------------------------------------

def _flagged(text: str) -> list[str]:
    return [f"{f.number} {f.unit}".strip() for f in figures_in(text) if problems_of(f, MEASUREMENTS)]


@pytest.mark.parametrize("bad", [
    "On an H100 the step took 47.0 ms in float32.",
    "The H100 ran float16 products at 635 TFLOP/s.",
    "Pinned copies reach 50 GB/s on a GPU.",
    "CUDA graphs made the step 5-7x faster on the GPU.",
    "On the A100 a launch costs tens of µs, about 20 µs.",
    "The T4 holds 16 GiB.",
    "On the same GPU, AMP took 22.4 ms and TF32 28.0.",
    "The GPU finished it in 12.2 → 2.3 ms.",
    "The H100 SXM5 has 132 streaming multiprocessors and 16,896 CUDA cores.",
    "A TPU v5e does 197 TFLOP/s.",
    "On the H100 the fused kernel took 3/5 of the time, 0.013 ms.",
    # a key that does not exist, or does not hold the number
    "Measured on the H100 (reference key `resnet18_step_ms_typo`): 47.0 ms.",
    "Measured on the H100 (reference key `resnet18_step_ms`): float32 48.0 ms.",
    "Measured on the H100 (reference key `resnet18_step_ms`): AMP was 5.2x faster.",
    # a label in another sentence does not count
    "The H100's bandwidth is a vendor spec. It copied 51 GB/s on the GPU.",
    # a published figure without the link to where it was published
    "PaLM's published figure is 46.2% MFU on TPU v4.",
    # a key without the word that says what it is, or a number from another entry
    "On the H100 (reference key `resnet18_step_ms`): 47.0 ms.",
    "Recorded on the H100 (reference key `h2d_gbps`): the step took 47.0 ms.",
    # a ratio of two values that measure different things at different sizes
    "Recorded on the H100 (reference key `resnet18_step_ms`): 224px AMP was 31.7x faster than 32px float32.",
])
def test_the_detector_flags_an_untraceable_gpu_figure(bad):
    assert _flagged(bad), bad


@pytest.mark.parametrize("good", [
    "Lesson 4 trains ResNet-18 at batch 128 on 224x224 images on a GPU (2022).",
    "On the GPU, n = 4096 and 2^20 elements, in float16 and bf16, on 8 GPUs, exercise 2 (3 points).",
    "The step takes about as long at 4x the batch on the H100.",
    "Vendor spec: the H100 SXM's memory delivers 3.35 TB/s.",
    "The H100's ridge point is predicted at about 190 FLOP per byte.",
    "PaLM's published figure is 46.2% MFU on TPU v4 ([Chowdhery et al., 2022](https://arxiv.org/abs/2204.02311)).",
    "Recorded on the H100 (reference key `resnet18_step_ms`): float32 47.0 ms, TF32 28.0, AMP float16 22.4.",
    "Measured on the H100 (reference key `resnet18_step_ms`): AMP float16 alone was 2.1x float32.",
    "Measured on the H100 (reference key `lesson02_matmul_tflops`): 52,000 GFLOP/s at n = 4096.",
    "Measured on the H100 (reference key `resnet18_peak_mib`): the step's own peak was about 2990 MiB.",
    "Measured on the H100 (reference key `resnet18_cuda_graph_ms`): 2.9 to 7.1 times faster, 12.21 → 2.26 ms.",
    "Measured on the H100 (reference key `lesson02_streams_ms`): overlap saved 45%.",
    "This CPU computed it at run time: {} ms, beside the GPU's {} ms.",
    "On the H100, pinned copies of 64 MiB ran beside 2^20 floats (4 MiB per tensor).",
    "The lesson:\n\n5. the H100's roofline, from the course's measurements;",
    "Recorded on the H100 (reference key `resnet18_step_ms`): 7.7 ms at batch 128 and 9.9 ms at batch 512.",
    "Recorded on the H100 (reference keys `lesson11_gpu_profile_us` and `h2d_gbps`): 10 ms of CPU time, 92 µs "
    "of GPU time, under 1%, and 50 GB/s.",
    "On a GPU a kernel finishes in a few µs; 100% of the roof is the bound.",
    "PyTorch/XLA 2.1 runs on a TPU v5e; see arXiv 2205.05198.",
    "torch 2.14 and CUDA 12.8 on the GPU, compute capability 8.0.",
    "Tensor tensors `x = torch.randn(8192, 8192)` on the GPU, see https://example.com/H100/1.5",
])
def test_the_detector_passes_numbers_that_are_not_figures_or_are_traced(good):
    assert not _flagged(good), (good, _flagged(good))


def test_the_gpu_named_in_the_paragraph_before_or_the_cell_before_counts(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["The same step on an H100."]},
                    {"cell_type": "markdown", "id": "b", "metadata": {}, "source": [
                        "Eager it took 12.2 ms.\n\nA third paragraph: 3.99 ms."]}]}
    (tmp_path / "lesson99").mkdir()
    (tmp_path / "lesson99" / "x.ipynb").write_text(json.dumps(nb))
    found = untraceable(tmp_path / "lesson99" / "x.ipynb", MEASUREMENTS)
    assert len(found) == 1 and "12.2" in found[0]  # two paragraphs away, the GPU no longer counts


def test_code_cells_are_read_by_their_strings_and_comments_only():
    source = ('x = torch.randn(8192, device="cuda")  # on an H100 this takes 0.3 ms\n'
              'print(f"GPU: {1000 * t:.2f} ms")\n'
              'print("the H100 did 635 TFLOP/s")\n')
    texts = code_texts(source)
    flagged = [f.number for t in texts for f in figures_in(t) if problems_of(f, MEASUREMENTS)]
    assert sorted(flagged) == ["0.3", "635"]
