"""The GPU reference (gpucourse.reference): one declared schema for every file and every reader, the
file picked for the GPU a lesson runs on, and the chart beside it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import nbformat
import pytest

import cell_names
import reference_fixture
from conftest import notebook_param
from gpucourse import bench_gpu
from gpucourse import reference as R

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_reference_keeps_the_schema_and_its_provenance():
    assert R.names(), "no reference shipped"
    for name in R.names():
        ref = R.load(name)
        assert R.validate(dict(ref.data)) == []
        assert ref.data["status"] == "measured, not estimated" and not ref.fixture
        assert ref.data["device"]["kind"] == "cuda" and ref.data["device"]["capability"]
        assert ref.data["date"] and ref.data["commit"]
        for name_, m in ref.data["measurements"].items():
            assert set(R.RECIPE_KEYS) <= set(m["recipe"]), name_


def test_bench_reference_is_the_package_folder():
    bench = ROOT / "bench" / "reference"
    assert bench.resolve() == R.FOLDER.resolve()


def test_the_shipped_h100_keeps_the_recorded_numbers_under_the_schemas_names():
    ref = R.load("h100")
    # probe.json's numbers, unchanged: only names and labels were mapped onto the schema
    assert ref.value("matmul_tflops", "tf32 8192") == 356.6
    assert ref.value("resnet18_step_ms", "b128 224px amp fp16 channels_last") == 13.12
    # the CUDA-graph probe left cuDNN's TF32 on: its float32 rows say so in their label and recipe
    assert ref.value("resnet18_cuda_graph_ms", "b128 32px fp32 cudnn-tf32 cuda graph") == 2.26
    assert not any(" fp32 eager" in label for label in ref.values("resnet18_cuda_graph_ms"))
    assert "TF32 convolutions" in ref.recipe("resnet18_cuda_graph_ms")["cudnn_tf32"]
    # the probe's peaks counted 1.28 GiB of earlier buffers, and the pageable source was never written
    assert "1.28 GiB" in ref.recipe("resnet18_peak_mib")["peak_reset"]
    assert "never written" in ref.recipe("h2d_gbps")["host_buffer"]
    assert ref.values("lesson04_saved_mib")["b8 32px autocast float16 weight copies"] == 21.31
    assert set(ref.data["archive"]) == {"matmul_tflops_bench", "lesson04_smoke_step_ms", "lesson04_smoke_peak_mib",
                                        "lesson05_smoke_copy_gbps"}


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.pop("commit"), "'commit'"),
    (lambda d: d.update(status="estimated"), "only measured numbers"),
    (lambda d: d.update(status=R.FIXTURE_STATUS), "only measured numbers"),
    (lambda d: d["device"].pop("name"), "device.name"),
    (lambda d: d["measurements"]["h2d_gbps"].pop("unit"), "no 'unit'"),
    (lambda d: d["measurements"]["h2d_gbps"].update(unit="MB/s"), "is in 'GB/s'"),
    (lambda d: d["measurements"]["h2d_gbps"].pop("recipe"), "no 'recipe'"),
    (lambda d: d["measurements"]["h2d_gbps"]["recipe"].pop("host_buffer"), "recipe.host_buffer"),
    (lambda d: d["measurements"]["resnet18_step_ms"]["recipe"].pop("cudnn_tf32"), "recipe.cudnn_tf32"),
    (lambda d: d["measurements"]["resnet18_peak_mib"]["recipe"].update(peak_reset=" "), "recipe.peak_reset"),
    (lambda d: d["measurements"]["matmul_tflops"]["recipe"].pop("memory_format"), "recipe.memory_format"),
    (lambda d: d["measurements"]["h2d_gbps"]["values"].update(pinned=float("nan")), "non-negative number"),
    (lambda d: d["measurements"]["h2d_gbps"]["values"].update(pinned="fast"), "non-negative number"),
    (lambda d: d["measurements"]["h2d_gbps"]["values"].update(fast=1.0), "not a label of 'h2d_gbps'"),
    (lambda d: d["measurements"]["matmul_tflops"]["values"].update({"float16 8192 emulated": 1.0}), "not a label"),
    (lambda d: d["measurements"].update(lesson09_new_ms=d["measurements"]["h2d_gbps"]), "not a measurement of the schema"),
    (lambda d: d.update(measurements={}), "at least one measurement"),
    (lambda d: d.update(absent={"h2d_gbps": {"pinned": ""}}), "needs the reason"),
])
def test_validate_names_what_is_wrong(breakage, message):
    data = copy.deepcopy(dict(R.load("h100").data))
    breakage(data)
    problems = R.validate(data)
    assert any(message in p for p in problems), problems


def test_an_emulated_bfloat16_label_is_a_label_of_the_schema():
    data = copy.deepcopy(dict(R.load("h100").data))
    data["measurements"]["matmul_tflops"]["values"]["bfloat16 8192 emulated"] = 1.0
    assert R.validate(data) == []


def test_load_refuses_an_invalid_file_and_names_the_missing_measurement(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": R.SCHEMA}))
    with pytest.raises(ValueError, match="not a valid reference"):
        R.load(str(bad))
    with pytest.raises(KeyError, match="not a reference measurement"):
        R.load("h100").values("nope")
    with pytest.raises(FileNotFoundError, match="shipped: h100"):
        R.load("a100")


def _write(folder: Path, short: str, name: str, capability: str, **changes) -> Path:
    data = copy.deepcopy(dict(R.load("h100").data))
    data["device"].update(short=short, name=name, capability=capability)
    data.update(changes)
    path = folder / f"{short.lower()}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def two_references(tmp_path, monkeypatch):
    """Three references in a folder (an A10G first in alphabetical order), none of them the GPU here."""
    monkeypatch.delenv(R.ENV, raising=False)
    _write(tmp_path, "H100", "NVIDIA H100 80GB HBM3", "9.0")
    _write(tmp_path, "T4", "Tesla T4", "7.5", date="2026-01-01")
    _write(tmp_path, "A10G", "NVIDIA A10G", "8.6")
    return tmp_path


@pytest.mark.parametrize("gpu, expected", [
    (("Tesla T4", "7.5"), "t4"),  # the device block's exact name
    (("NVIDIA H100 PCIe", "9.0"), "h100"),  # another H100: its short name is a word of the GPU's name
    (("NVIDIA A10G", "8.6"), "a10g"),
    (("NVIDIA GeForce RTX 3090", "8.6"), "a10g"),  # no name matches: the same compute capability
    (("NVIDIA L4", "8.9"), "h100"),  # nothing matches: the documented default, not the first file
    (None, "h100"),  # no GPU
])
def test_pick_matches_the_gpu_to_a_files_device_never_the_alphabetical_order(two_references, gpu, expected):
    assert R.pick(two_references, gpu=gpu) == expected
    assert R.names(two_references)[0] == "a10g"  # what the alphabetical order would have picked


def test_load_reads_the_named_reference_then_the_environment_then_this_gpu(two_references, monkeypatch):
    monkeypatch.setattr(R, "_gpu", lambda: ("Tesla T4", "7.5"))
    assert R.load(folder=two_references).short == "T4"
    assert R.load("h100", folder=two_references).short == "H100"
    monkeypatch.setenv(R.ENV, "a10g")
    assert R.load(folder=two_references).short == "A10G"
    monkeypatch.setenv(R.ENV, str(two_references / "h100.json"))
    assert R.load(folder=two_references).short == "H100"
    monkeypatch.setattr(R, "_gpu", lambda: None)
    monkeypatch.delenv(R.ENV)
    assert R.load(folder=two_references).short == "H100"


def test_a_fixture_loads_only_from_a_path_outside_the_shipped_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(R.ENV, raising=False)
    fixture = bench_gpu.write(reference_fixture.made_up(), tmp_path / "fixture.json")
    ref = R.load(str(fixture))
    assert ref.fixture and "TEST FIXTURE" in ref.label()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "fixture.json").write_text(fixture.read_text())
    with pytest.raises(ValueError, match="only measured numbers"):
        R.load("fixture", folder=shipped)


def test_what_a_file_lacks_is_said_not_shown_as_another_gpus_number(tmp_path):
    data = copy.deepcopy(dict(R.load("h100").data))
    del data["measurements"]["resnet18_cuda_graph_ms"]
    data["measurements"]["matmul_tflops"]["values"].pop("tf32 8192")
    data["absent"] = {"matmul_tflops": {"tf32 8192": "TF32 needs compute capability 8.0 or later"}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    ref = R.load(str(path))
    assert ref.values("resnet18_cuda_graph_ms") == {} and not ref.has("resnet18_cuda_graph_ms")
    assert ref.missing("resnet18_cuda_graph_ms") == "not measured on the H100: resnet18_cuda_graph_ms"
    assert ref.missing("matmul_tflops", ["tf32 8192"]) == (
        "not measured on the H100: matmul_tflops (tf32 8192) (TF32 needs compute capability 8.0 or later)")
    assert ref.missing("matmul_tflops", ["float32 8192"]) == ""
    assert ref.note(lambda v: f"{v['tf32 8192']}x", "matmul_tflops", "tf32 8192").startswith("not measured")
    assert ref.note(lambda v: f"{v['float32 8192']}", "matmul_tflops", "float32 8192") == "51.3"
    with pytest.raises(KeyError, match="not measured on the H100"):
        ref.value("matmul_tflops", "tf32 8192")


def test_in_strict_mode_reading_what_a_file_lacks_fails(tmp_path, monkeypatch):
    data = copy.deepcopy(dict(R.load("h100").data))
    del data["measurements"]["lesson04_saved_mib"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    ref = R.load(str(path))
    monkeypatch.setenv(R.STRICT_ENV, "1")
    with pytest.raises(KeyError, match="no 'lesson04_saved_mib'"):
        ref.values("lesson04_saved_mib")
    with pytest.raises(KeyError, match=r"lacks matmul_tflops \(float32 4096\)"):
        ref.note(lambda v: "", "matmul_tflops", "float32 4096")
    assert ref.note(lambda v: "all there", "matmul_tflops", "float32 8192") == "all there"


def test_reference_values_read_back():
    ref = R.load("h100")
    assert ref.unit("matmul_tflops") == "TFLOP/s"
    assert ref.value("matmul_tflops", "float16 8192") > ref.value("matmul_tflops", "float16 8191")
    assert "H100" in ref.label() and "measured" in ref.label()


# Every measurement name a lesson or a helper reads, found in their source: each must be declared.
READ = re.compile(r"""(?:values|value|has|missing|measurement|recipe|unit)\(\s*\\?["']([a-z0-9_]+)\\?["']"""
                  r"""|\bnote\(.*?["']([a-z0-9_]+)["']\s*,|REFERENCE_SPEEDUP = "([a-z0-9_]+)\"""")


def _reading_sources():
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(path, 4)
        yield path.parent.name, "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for path in sorted((ROOT / "src" / "gpucourse").glob("*.py")):
        yield path.name, path.read_text()


def test_every_measurement_a_lesson_or_helper_reads_is_declared_and_written_by_bench_gpu():
    read = {}
    for where, text in _reading_sources():
        for match in READ.finditer(text):
            name = next(g for g in match.groups() if g)
            if name in R.MEASUREMENTS or re.fullmatch(r"(lesson\d\d_\w+|matmul_\w+|resnet18_\w+|h2d_\w+)", name):
                read.setdefault(name, set()).add(where)
    assert {"matmul_tflops", "lesson02_timing_ms", "lesson04_saved_mib", "lesson05_conv_ms",
            "resnet18_bench_peak_mib", "lesson01_count_primes_speedup"} <= set(read)
    undeclared = {name: sorted(where) for name, where in read.items() if name not in R.MEASUREMENTS}
    assert not undeclared, f"read but not in gpucourse.reference.MEASUREMENTS: {undeclared}"
    assert set(bench_gpu.RECIPES) == set(bench_gpu.WHAT) == set(R.MEASUREMENTS)


def test_plot_beside_labels_both_machines_and_skips_what_was_not_measured():
    ref = R.load("h100")
    fig = R.plot_beside({"float32": 0.2}, {"float32": 51.3, "float16": 635.4}, title="Matmul 8192",
                        unit="TFLOP/s", mine_label="this CPU", reference_label=ref.label(),
                        note="the reference GPU is 250x faster", log=True)
    ax = fig.axes[0]
    assert "Matmul 8192" in ax.get_title() and "250x" in ax.get_title()
    assert ax.get_ylabel() == "TFLOP/s"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["this CPU", ref.label()]
    assert len(ax.patches) == 3  # no bar for the float16 this machine did not measure
    with pytest.raises(ValueError, match="nothing to plot"):
        R.plot_beside({}, {}, title="t", unit="u", mine_label="a", reference_label="b")


LOADS = re.compile(r"R\.load\(|reference\.load\(")  # a cell that loads the reference itself


def _loading_cells(nb) -> set[int]:
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and LOADS.search(c.source)}


# The lessons whose cells load the reference. A helper that loads it only in some runs (lesson 1's
# ``speedup_note``, where processes lost) is run against the written reference by its own test below.
READERS = [p for p in sorted((ROOT / "solutions").glob("*/*.ipynb")) if _loading_cells(nbformat.read(p, 4))]


def test_lesson1_speedup_note_reads_what_bench_gpu_writes(tmp_path, monkeypatch):
    from gpucourse import processes_threads as P

    fixture = bench_gpu.write(reference_fixture.made_up(), tmp_path / "fixture.json")
    monkeypatch.setenv(R.ENV, str(fixture))
    monkeypatch.setenv(R.STRICT_ENV, "1")
    lost = [P.Measurement("count_primes", "serial", 1, 0.4, 1.0), P.Measurement("count_primes", "processes", 2, 0.8, 0.5)]
    note = P.speedup_note(lost, smoke=True)
    written = R.load(str(fixture)).values(P.REFERENCE_SPEEDUP)
    assert f"16 processes {written['processes x16']:.1f}×" in note and "smoke size" in note


def test_lesson1_speedup_note_says_why_where_a_gpus_reference_did_not_measure_its_host(monkeypatch):
    """h200.json lists lesson 1's host speedups under ``absent`` (its lease ran out): the note gives that reason
    instead of an empty list of speedups."""
    from gpucourse import processes_threads as P

    monkeypatch.setenv(R.ENV, "h200")
    monkeypatch.delenv(R.STRICT_ENV, raising=False)
    lost = [P.Measurement("count_primes", "serial", 1, 0.4, 1.0), P.Measurement("count_primes", "processes", 2, 0.8, 0.5)]
    note = P.speedup_note(lost, smoke=True)
    reason = R.load("h200").missing(P.REFERENCE_SPEEDUP)
    assert "never beat serial at smoke size" in note and reason and reason in note and "×" not in note


def cells_to_run(path: Path) -> set[int] | None:
    """The cells of solution notebook ``path`` a run against another reference must make: those that read a
    reference file in this pytest run's execution of it (``conftest.reference_cells``: a helper's read counts),
    those that read a name such a cell binds (the reference it loaded, values taken from it), and the cells
    they need (``cell_names.needed``). The others read no reference: they run as in the solution run, and
    only their imports run here. None (all of them) where that run failed."""
    from conftest import NotebookFailed, reference_cells

    try:
        reads = set(reference_cells(path))
    except NotebookFailed:  # tests/test_notebooks.py reports it; here every cell runs
        return None
    nb = nbformat.read(path, 4)
    reads |= _loading_cells(nb)  # where a run's numbers chose a branch without the load: it loads here
    cells = cell_names.of_notebook(nb)
    run = reads | cell_names.reached(cells, {i: cells[i][1] for i in reads if cells[i] is not None})
    run |= {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and cells[i] is None}  # not Python: unknown
    return run | cell_names.needed(cells, run)


@pytest.mark.slow
@pytest.mark.parametrize("path", [notebook_param(p) for p in READERS], ids=lambda p: p.parent.name)
def test_every_cell_that_reads_the_reference_runs_against_what_bench_gpu_writes(path, tmp_path, monkeypatch):
    """The lesson at smoke size with GPUCOURSE_REFERENCE naming a fixture written by bench_gpu's own writer
    (every declared label, made-up numbers) and GPUCOURSE_REFERENCE_STRICT=1: a key or label the lesson
    reads and bench-gpu does not write raises in its cell. (The CPU branches here; `make test-gpu` runs
    the GPU branches against the shipped reference.) Only the cells that read the reference, and those they
    need, run (``cells_to_run``); at least one of them reads it here too."""
    from conftest import execute_notebook

    fixture = bench_gpu.write(reference_fixture.made_up(), tmp_path / "fixture.json")
    monkeypatch.setenv(R.ENV, str(fixture))
    monkeypatch.setenv(R.STRICT_ENV, "1")  # a read of anything the fixture lacks raises in the cell
    monkeypatch.setenv("GPUCOURSE_SMOKE", "1")
    monkeypatch.setenv("GPUCOURSE_OFFLINE", "1")
    nb = nbformat.read(path, 4)
    run = cells_to_run(path)
    if run is not None:
        cell_names.elide(nb, [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in run])
    recorded = execute_notebook(nb, cwd=tmp_path, timeout=900, record=True)
    assert recorded["read"], "no cell read the reference"
    printed = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "not measured on the" not in printed, "the fixture holds every declared label"
