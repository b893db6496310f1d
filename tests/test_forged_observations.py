"""Judges pass only on a student's evidence: forged observations fail every case of every exercise.

An observation is what an observer returned in the sandbox, where the student's code also ran; a judge
must rebuild the inputs and expected values itself (from the inputs it drew) and treat empty or missing data as a
failure. Each case's judge is fed observations no answer produced: empty structures, and structures
claiming their own expected values (``expected`` equal to ``got``, rows with nothing wrong, ranks that
agree). It must fail each of them, as the grader counts it: a message, or an exception (``engine._judge``
turns a judge's exception into a failed check).
"""

from __future__ import annotations

import pytest

from gpucourse import checks

EMPTY = [None, {}, [], "", 0, 0.0, True, {"ok": True}, {"data": {}}, [{}], [[]], {"": {}}]

# structures shaped like the course's observations, claiming what a judge might expect; each fills every
# key a judge might read with an empty or self-consistent value
CLAIMS = [
    {"expected": [], "values": [], "inputs": []},
    {"expected": [1, 2], "values": [1, 2], "inputs": [1, 2], "got": [1, 2]},
    {"expected": {"a": 1}, "got": {"a": 1}, "values": {"a": 1}, "inputs": {"a": 1}},
    {"configs": 0, "rows": []},
    {"returncode": 0, "ranks": {}, "tail": ""},
    {"returncode": 0, "ranks": {"0": {"rank": 0}, "1": {"rank": 1}}, "tail": ""},
    {"returncode": 0, "ranks": {"0": {"rank": 0, "world_size": 2, "runs": [], "per_epoch": [], "grad_gaps": [],
                                      "no_grad": [], "weights": [], "logged": {}},
                                "1": {"rank": 1, "world_size": 2, "runs": [], "per_epoch": [], "grad_gaps": [],
                                      "no_grad": [], "weights": [], "logged": {}}}, "tail": ""},
    {"events": [], "losses": [], "batches": 0, "sizes": [], "tensors": 0, "moved": 0},
    {"requests": [], "texts": []},
    {"envs": [], "results": []},
    {"results": [], "expected": []},
    {"lines": [], "not_ints": []},
    {"seconds": 0.0, "launches": 0},
]
FORGERIES = [pytest.param(f, id=f"empty{i}") for i, f in enumerate(EMPTY)] + \
            [pytest.param(f, id=f"claim{i}") for i, f in enumerate(CLAIMS)]


def _every_case():
    from autograders import engine

    params = []
    for exercise in checks.exercises():
        hidden = engine.load_checks(exercise.assignment)
        for case_id, case in engine.cases_for(hidden, exercise.name):
            params.append(pytest.param(case, id=f"{exercise.assignment}/{case_id}"))
    return params


def _fails(case, data) -> bool:
    """Judged as the grader judges it: a case that draws its inputs with inputs drawn here, as at grading."""
    import copy
    import random

    from autograders import engine

    return engine._judge(case, {"ok": True, "data": copy.deepcopy(data)}, case.inputs(random.Random(0))) is not None


@pytest.mark.parametrize("case", _every_case())
def test_a_forged_observation_fails_every_case(case):
    passed = []
    for forgery in [*EMPTY, *CLAIMS]:
        if not _fails(case, forgery):
            passed.append(forgery)
    assert not passed, f"{case.name}: passed on forged observations {passed}"


# observations shaped exactly like a case's own, whose inputs and expected values were chosen to agree with
# the answer reported: judges that read their expectations from the observation accepted each of these
SHAPED = {
    ("parallel_map", "results follow the order of items"): {"expected": [1, 2], "io": [1, 2], "cpu": [1, 2]},
    ("parallel_map", "a list of [fn(x) for x in items]"): {},
    ("parallel_map", "other kinds raise ValueError"): {"'gpu' with 1 item(s)": "ValueError"},
    ("parallel_map", "kind='cpu' runs in other processes"): {"me": 1, "pids": []},
    ("lines_dataset", "other files"): {"values": [3], "len": 1, "is_dataset": True, "items": [3]},
    ("lines_dataset", "indices outside"): {"one line": {"len": 1, "first": -31, "outcomes": {}}},
    ("lines_dataset", "pickled after use"): {"values": [3], "read": [3], "copied": [3], "loaded": [3]},
    ("average_across_ranks", "the mean over all ranks"): {
        "returncode": 0, "tail": "", "inputs": {"shards": [], "tensors": []},
        "ranks": {r: {"rank": int(r), "generated": {"shards": [], "averages": []}} for r in ("0", "1")}},
    ("average_across_ranks", "shard_indices: a list"): {
        "returncode": 0, "tail": "", "inputs": {"shards": [[2, 0, 1]], "tensors": []},
        "ranks": {r: {"rank": int(r), "generated": {"shards": [{"args": [2, 0, 1], "is_list": True, "ints": True,
                                                                   "type": "list", "indices": [0, 1]}], "averages": []}}
                  for r in ("0", "1")}},
    ("average_across_ranks", "both ranks finish and agree"): {
        "returncode": 0, "tail": "", "ranks": {r: {"rank": int(r), "average": [], "shards": {"10": [], "7": []}}
                                               for r in ("0", "1")}},
    ("add_positions", "values: x + p"): [{"shape": [1, 1, 1], "x": [[[0.0]]], "out_shape": [1, 1, 1], "out": [[[0.0]]]}],
    ("measure", "the median of the repeats (an odd count)"): {"3": {"seconds": 0.02, "launches": 4, "plan": [0.02] * 3}},
    ("measure", "warm-up calls"): {"1/1": {"seconds": 0.03, "launches": 2}},
    ("triton_scaled_add", "generated sizes"): {"configs": 0, "rows": []},
    ("pad_mlp", "widths:"): [{"widths": [2, 2], "multiple": None, "got": [[2, 2]]}],
    ("pad_mlp", "the same function"): {"sigmoid": 0.0},
    ("train_epoch", "returns the mean loss"): {"events": [], "sizes": [], "is_float": True, "type": "float", "value": 0.0},
    ("train_epoch", "evaluate under autocast"): {"eval_events": [["forward", True, False]], "accuracy": 0.5,
                                                 "expected_accuracy": 0.5, "predictions": []},
    ("clipped_step", "the clip sees the true gradient norm"): {
        "events": [["optimizer.step", 1.0]], "true_norm": 4.0, "max_norm": 1.0, "is_float": True, "type": "float",
        "returned": 4.0},
    ("clipped_step", "generated sizes and max_norm"): [],
    ("to_device", "nested batches keep their structure"): [{"device": "cpu", "expected": ["dict", {}], "got": ["dict", {}],
                                               "pinned": [], "calls": [], "same_leaves": True}],
    ("device_agnostic", "other sizes"): {"1 feature(s), a batch of 4": {"shape": [4, 1], "want": [4, 1], "close": True}},
    ("device_agnostic", "same function"): {"cpu": {"shape": [5, 1], "close": True}, "parameters": ["readout.bias", "readout.weight"],
                                           "float64": {"dtype": "torch.float64", "device": "cpu"},
                                           "meta": {"device": "meta", "shape": [5, 1]}},
    ("picklable", "noise=0.1 by default"): True,
    ("picklable", "pickles like ddp_spawn"): {"pickled": "ok", "augment": {"original": True, "unpickled": True},
                                              "same_weights": True, "loss": True},
    ("effective_batch", "every strategy of the table"): {"cases": [], "batch": [], "lr": []},
    ("accumulate_no_sync", "one all-reduce per step"): {
        "returncode": 0, "tail": "", "ranks": {r: {"rank": int(r), "runs": []} for r in ("0", "1")}},
    ("average_gradients", "both ranks end with DDP's weights"): {
        "returncode": 0, "tail": "", "ranks": {r: {"rank": int(r), "weights": [0.0], "max_gap_to_ddp": 0.0} for r in ("0", "1")}},
    ("sbatch_for", "tasks per node"): {"requests": [], "texts": []},
    ("pad_to_bucket", "torch.compile(dynamic=False)"): {"graphs": 1, "widths": [8], "needed": [8], "max_diff": 0.0,
                                                        "outputs": []},
    ("pad_mlp", "float32, bfloat16 and float16"): {"torch.float32": {"params": ["torch.float32"], "out": "torch.float32", "diff": 0.0,
                                                            "values": []},
                                          "torch.bfloat16": {"params": ["torch.bfloat16"], "out": "torch.bfloat16"}},
}


def _case_named(exercise: str, words: str):
    from autograders import engine

    declared = next(e for e in checks.exercises() if e.name == exercise)
    found = [c for _, c in engine.cases_for(engine.load_checks(declared.assignment), exercise) if words in c.name]
    assert found, f"{exercise}: no case named like {words!r}"
    return found


@pytest.mark.parametrize("exercise, words", list(SHAPED), ids=[f"{e}: {w}" for e, w in SHAPED])
def test_an_observation_claiming_its_own_expected_values_fails(exercise, words):
    for case in _case_named(exercise, words):
        assert _fails(case, SHAPED[(exercise, words)]), f"{case.name}: passed on a forged observation"
