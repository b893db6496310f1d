"""gpucourse.profiling (lesson 11's helpers) and the traces lesson 11's checks generate."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import ROOT, needs_cuda
from gpucourse import profiling as P
from gpucourse.checks import lesson11_profiling as L


def _hidden():
    spec = importlib.util.spec_from_file_location("hidden_lesson11", ROOT / "autograders" / "checks" / "lesson11_profiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profiled_loop_labels_its_phases_and_shows_the_read(tmp_path):
    """3 active steps: each phase's CPU range 3 times; loss.item() is aten::item + _local_scalar_dense, only with sync."""
    loader = DataLoader(P.SlowDataset(n=64, features=8), batch_size=8)
    for sync in (False, True):
        model = P.tiny_model(features=8, hidden=8)
        prof = P.profile_training(loader, model, torch.optim.SGD(model.parameters(), lr=0.1), sync=sync)
        prof.export_chrome_trace(str(tmp_path / f"{sync}.json"))
        events = P.load_trace(tmp_path / f"{sync}.json")
        ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] in P.PHASES]
        assert sorted(e["name"] for e in ranges) == sorted(list(P.PHASES) * 3)
        reads = [e for e in events if e.get("name") in ("aten::item", "aten::_local_scalar_dense")]
        assert len(reads) == (6 if sync else 0)
        optimizer = [r for r in ranges if r["name"] == "optimizer"]
        assert all(any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in optimizer) for e in reads)


def test_slow_dataset_sleeps_per_item(monkeypatch):
    slept = []
    monkeypatch.setattr(P.time, "sleep", slept.append)
    data = P.SlowDataset(n=4, features=3, delay=0.02)
    x, y = data[1]
    assert slept == [0.02] and x.shape == (3,) and y.shape == (1,)
    assert len(data) == 4


def test_timeline_draws_each_phase_and_the_sync_ops():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = {"order": ["load", "fwd", "bwd"], "phases": ["load", "fwd", "bwd"], "steps": 2, "seed": 3,
            "us": {"load": 500.0, "fwd": 100.0, "bwd": 200.0}, "syncs": {"bwd": "item"}, "gpu": True}
    fig = P.draw_timeline(L.synthetic_trace(spec), phases=spec["phases"], title="two steps")
    ax = fig.axes[0]
    assert isinstance(fig, matplotlib.figure.Figure)
    assert ax.get_title() == "two steps" and "(ms)" in ax.get_xlabel() and ax.get_ylabel() == "phase"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["load", "fwd", "bwd", "sync ops"]
    bars = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
    assert [len(b.get_paths()) for b in bars] == [2, 2, 2]  # CPU ranges only: the GPU's are not drawn
    marks = [c for c in ax.collections if isinstance(c, matplotlib.collections.LineCollection)]
    assert sum(len(m.get_segments()) for m in marks) == 4  # aten::item and its _local_scalar_dense, twice
    plt.close(fig)


@pytest.mark.parametrize("kinds", [{}, {"stall": "no"}, {"uneven": True}, {"share": True}, {"gpu": True},
                                   {"decoys": True, "shuffle": True, "outside": True}])
def test_generated_traces_hold_what_their_spec_says(kinds):
    """Each phase's CPU ranges sum to the spec's time, the slowest phase is never within 0.06 of the
    threshold, and the hidden checks' expected stall follows the spec."""
    hidden = _hidden()
    for spec in L.trace_specs(77, 12, **kinds):
        events = L.synthetic_trace(spec)
        assert all("dur" in e for e in events if e.get("ph") == "X")
        totals = {p: sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                         and e["name"] == p) for p in spec["phases"]}
        share = spec.get("share", 0.5)
        largest = max(totals, key=totals.get)
        fraction = totals[largest] / sum(totals.values())
        assert abs(fraction - share) >= 0.055, (spec, fraction)
        stall, syncs = hidden.expected_for(spec)
        assert stall == (largest if fraction > share else None)
        assert syncs == sorted(spec["syncs"])
        if kinds.get("share") and stall is None and share >= 0.64:
            assert fraction > 0.5  # the case that tells a fixed 0.5 from `share`


@pytest.mark.parametrize("seed", range(4))
def test_the_hidden_draws_accept_the_rule_and_the_boundaries_hold(seed):
    """Every drawn trace judged with the grader's reference accepts an answer written here; the boundaries say
    what the text says (exactly `share` is no stall, a total of 0 has none, both ends of a range are in it)."""
    import random

    hidden = _hidden()

    def right(events, phases, share=0.5):
        stall, syncs = hidden.reference_diagnose(events, phases, share)
        return {"stall": stall, "syncs": syncs}

    for case in hidden.HIDDEN["diagnose"][:-1]:  # the last one profiles a real loop: the fixtures run it
        specs = case.draw(random.Random(seed))
        assert case.judge(L.observe_diagnoses({"diagnose": right}, specs), specs) is None, case.name
    edges = {s["label"]: hidden.expected_for(s) for s in hidden.draw_edges(random.Random(seed))}
    assert edges["a phase at exactly share=0.5"] == (None, [])
    assert edges["two phases at half each"] == (None, [])
    assert edges["phases that never ran: a total of 0"] == (None, [])
    assert edges["a phase with all the time beside one with none"] == ("data", [])
    assert edges["a label that is not a phase takes most of the step: not in the total"] == ("backward", [])
    syncs = {s["label"]: hidden.expected_for(s) for s in hidden.draw_sync_edges(random.Random(seed))}
    assert syncs["sync ops at a range's first and last microsecond"][1] == ["model", "update"]
    assert syncs["a sync op at an end of a range of no duration"][1] == ["zero"]
    assert syncs["a sync op in a label that is not a phase"][1] == []
    assert hidden.expected_for(hidden.draw_gpu(random.Random(seed))[0])[0] == "a"


def test_quiet_kineto_only_where_cuda_is_unavailable(monkeypatch):
    import os
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    quiet = P.quiet_kineto_without_cuda()
    assert quiet == (torch.version.cuda is not None and not torch.cuda.is_available())
    assert os.environ.get("KINETO_LOG_LEVEL") == ("6" if quiet else None)
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")  # a level the user chose stays
    P.quiet_kineto_without_cuda()
    assert os.environ["KINETO_LOG_LEVEL"] == "2"


@pytest.mark.slow  # profiles a Lightning fit in a fresh Python (about 13 s): `make test`, not `make test-fast`
def test_the_code_35_message_goes_away(tmp_path):
    """In a fresh process: a profile prints Kineto's gpuGetDeviceCount error, unless quieted first."""
    import subprocess
    import sys

    if torch.version.cuda is None or torch.cuda.is_available():
        pytest.skip("the message appears only with a CUDA build of torch on a machine without a usable GPU")
    script = ("import torch\nfrom gpucourse import profiling as P\n{quiet}"
              "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):\n    torch.ones(3) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    runs = {quiet: subprocess.run([sys.executable, "-c", script.format(quiet="P.quiet_kineto_without_cuda()\n" if quiet else "")],
                                  capture_output=True, text=True, timeout=300, env=env) for quiet in (False, True)}
    assert all(run.returncode == 0 for run in runs.values()), runs
    if "gpuGetDeviceCount" not in runs[False].stderr:
        pytest.skip("this torch's Kineto does not print the message: nothing to silence")
    assert "gpuGetDeviceCount" not in runs[True].stderr


def test_profile_totals_read_the_table_totals():
    loader = DataLoader(P.SlowDataset(n=64, features=8), batch_size=8)
    model = P.tiny_model(features=8, hidden=8)
    prof = P.profile_training(loader, model, torch.optim.SGD(model.parameters(), lr=0.1))
    totals = P.profile_totals(prof)
    assert list(totals) == ["self CPU time, 3 steps"]  # a CPU run records no CUDA time
    assert totals["self CPU time, 3 steps"] == pytest.approx(prof.key_averages().self_cpu_time_total)


def test_step_ms_times_a_training_step_and_graphs_need_cuda():
    ms = P.step_ms(P.tiny_model(), 16, "cpu", min_seconds=0.01)
    assert ms > 0
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        P.step_ms(P.tiny_model(), 16, "cpu", graphed=True)


@needs_cuda("CUDA graphs need a CUDA GPU")
def test_step_ms_replays_a_cuda_graph():
    assert P.step_ms(P.tiny_model(), 128, "cuda", graphed=True, min_seconds=0.05) > 0


def test_busy_and_step_figures_name_both_machines():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for draw, unit in ((P.plot_busy, "µs"), (P.plot_step_times, "ms")):
        fig = draw({"b128 eager": 0.4}, "AMD EPYC: tiny model", {"b128 eager": 12.21, "b128 CUDA graph": 2.26},
                   "NVIDIA H100 (measured): ResNet-18", note="launch-bound")
        ax = fig.axes[0]
        assert "launch-bound" in ax.get_title() and unit in ax.get_ylabel() and ax.get_xlabel()
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["AMD EPYC: tiny model", "NVIDIA H100 (measured): ResNet-18"]
        assert len(ax.patches) == 3
        plt.close(fig)


def test_device_total_counts_kernels_not_the_gpu_view_of_labelled_ranges():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    events = [SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=False, self_device_time_total=20.0),
              SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=True, self_device_time_total=750.0),
              SimpleNamespace(device_type=DeviceType.CPU, is_legacy=False, is_user_annotation=False, self_device_time_total=5.0),
              SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=False, self_device_time_total=13.9)]
    assert P.device_time_total(events) == pytest.approx(33.9)
