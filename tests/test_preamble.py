"""gpucourse.preamble: sizes by smoke setting and by device."""

from __future__ import annotations

import pytest
import torch

from gpucourse.preamble import Setup


def test_size_picks_smoke_full_or_cpu_size():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert Setup(0, cpu, smoke=True).size(100, 2, cpu=10) == 2  # the smoke size wins
    assert Setup(0, cpu, smoke=False).size(100, 2, cpu=10) == 10  # a GPU-sized workload, cut for a CPU
    assert Setup(0, gpu, smoke=False).size(100, 2, cpu=10) == 100
    assert Setup(0, cpu, smoke=False).size(100, 2) == 100  # without cpu=, full everywhere
    assert Setup(0, torch.device("mps"), smoke=False).size(100, 2, cpu=10) == 100
    assert Setup(0, cpu, smoke=False).size([1, 2, 4], [1], cpu=[1, 2]) == [1, 2]


def test_require_turns_a_missing_accelerator_into_an_error(monkeypatch, capsys):
    import torch

    from gpucourse.preamble import Setup

    here = Setup(seed=0, device=torch.device("cpu"), smoke=True)
    monkeypatch.setattr("gpucourse.preamble.accelerator_count", lambda kind: {"cuda": 0, "tpu": 0}[kind])
    monkeypatch.setenv("GPUCOURSE_REQUIRE", "cuda")
    with pytest.raises(RuntimeError, match="GPUCOURSE_REQUIRE=cuda"):
        here.needs("cuda")
    assert here.needs("tpu") is False  # only the kinds named are required
    monkeypatch.setattr("gpucourse.preamble.accelerator_count", lambda kind: 1)
    assert here.needs("cuda", 2) is False  # one GPU cannot stand in for two: still a skip, with its reason
    assert "needs 2 CUDA devices; this machine has 1" in capsys.readouterr().out
    monkeypatch.delenv("GPUCOURSE_REQUIRE")
    monkeypatch.setattr("gpucourse.preamble.accelerator_count", lambda kind: 0)
    assert here.needs("cuda") is False


def test_uses_answer_turns_a_stub_or_missing_answer_into_one_line(capsys):
    import pytest

    from gpucourse.preamble import Setup

    S = Setup(seed=0, device="cpu", smoke=True)

    def stub(*args):
        raise NotImplementedError()

    with S.uses_answer(2, "train_epoch"):
        stub()
        raise AssertionError("not reached")
    assert capsys.readouterr().out == "Skipped: answer exercise 2 (`train_epoch`) first; this cell runs it.\n"
    with S.uses_answer(3, "clipped_step", "evaluate"):
        clipped_step()  # noqa: F821 - not defined yet, as before its exercise is answered
    assert "answer exercise 3 (`clipped_step`, `evaluate`) first" in capsys.readouterr().out
    with S.uses_answer(1, "f"):
        done = True
    assert done and capsys.readouterr().out == ""
    with pytest.raises(NameError):  # a typo of the student's own is theirs to see
        with S.uses_answer(1, "f"):
            undefined_name  # noqa: B018, F821
    with pytest.raises(ZeroDivisionError):
        with S.uses_answer(1, "f"):
            1 / 0
    with pytest.raises(ValueError, match="name the answer"):
        with S.uses_answer(1):
            pass
