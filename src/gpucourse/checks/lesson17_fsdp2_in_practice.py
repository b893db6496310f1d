"""Public checks for lesson 17 (FSDP2 in practice). Observers are self-contained: see lesson01_processes_threads.py.

The public cases call the answers on fixed inputs and compare with expected values stored here, worked
out once by hand from the exercises' texts (``MESH_PUBLIC_WANT``, ``TRAFFIC_PUBLIC_WANT``): this module
holds no way to compute a mesh or a byte count. Grading draws other inputs and compares with the
grader's own reference.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson17_fsdp2_in_practice"  # the course folder this module's exercises belong to


def _calls_of_table(rows):
    from gpucourse.checks.values import describe

    return [{"args": describe(list(args)), "kwargs": describe({})} for args in rows]


# --- Exercise 1: the bytes one FSDP unit moves in a step ------------------------------------------------

TRAFFIC_PUBLIC = [
    [[[30, 30], [30]], 4, True, 4, 4],
    [[[30, 30], [30]], 4, False, 2, 4],
    [[[30, 30], [30]], 4, 2, 4, 4],
    [[[8, 3]], 1, True, 4, 4],
]
# worked by hand: 8 rows of 30 plus 8 of the bias per rank (248 elements, padded from 30 rows to 32)
TRAFFIC_PUBLIC_WANT = [
    {"all_gather": 5952, "reduce_scatter": 2976},
    {"all_gather": 1488, "reduce_scatter": 2976},
    {"all_gather": 4960, "reduce_scatter": 2976},
    {"all_gather": 0, "reduce_scatter": 0},
]
TRAFFIC_BAD_PUBLIC = [[[[[8, 3]], 4, 3, 4, 4], "ValueError"], [[[[8, 3]], 4, 2.0, 4, 4], "TypeError"],
                      [[[[8, 3]], 0, True, 4, 4], "ValueError"]]


def observe_traffic(ns):
    """``fsdp_step_traffic`` on TRAFFIC_PUBLIC and TRAFFIC_BAD_PUBLIC, as ``observe_calls`` reports it."""
    from gpucourse.checks import observe_calls
    from gpucourse.checks.lesson17_fsdp2_in_practice import TRAFFIC_BAD_PUBLIC, TRAFFIC_PUBLIC, _calls_of_table

    return {"good": observe_calls(ns, "fsdp_step_traffic", _calls_of_table(TRAFFIC_PUBLIC)),
            "bad": observe_calls(ns, "fsdp_step_traffic", _calls_of_table([args for args, _ in TRAFFIC_BAD_PUBLIC]))}


def judge_traffic(d):
    from gpucourse.checks.lesson17_fsdp2_in_practice import TRAFFIC_PUBLIC, TRAFFIC_PUBLIC_WANT
    from gpucourse.checks.values import describe, type_words

    if not isinstance(d, dict) or len(d.get("good", [])) != len(TRAFFIC_PUBLIC):
        return "the answer was not called on every public case"
    for args, want, got in zip(TRAFFIC_PUBLIC, TRAFFIC_PUBLIC_WANT, d["good"]):
        where = f"fsdp_step_traffic{tuple(args)}"
        if not isinstance(got, dict) or "returned" not in got:
            return f"{where} raised {got.get('raised', ['an exception'])[0] if isinstance(got, dict) else 'nothing'}"
        if type_words(got["returned"]) != "a dict":
            return f"{where} returned {type_words(got['returned'])}: return a dict of two ints"
        if got["returned"] != describe(want):
            return (f"{where} returned a wrong count: per-rank shards of ceil(rows / world_size) rows, the "
                    "backward all-gather as reshard_after_forward says (the exercise's text works the first example out)")
    return None


def judge_traffic_errors(d):
    from gpucourse.checks.lesson17_fsdp2_in_practice import TRAFFIC_BAD_PUBLIC

    if not isinstance(d, dict) or len(d.get("bad", [])) != len(TRAFFIC_BAD_PUBLIC):
        return "the answer was not called on every public case"
    for (args, error), got in zip(TRAFFIC_BAD_PUBLIC, d["bad"]):
        raised = got.get("raised", []) if isinstance(got, dict) else []
        if error not in raised:
            did = f"raised {raised[0]}" if raised else "returned"
            return f"fsdp_step_traffic{tuple(args)} {did}; it must raise {error}"
    return None


register("fsdp_step_traffic",
         Case("a 30-wide Linear on 4 ranks: True, False (bf16), 2; one rank", observe_traffic, judge_traffic),
         Case("3 does not divide 4, a float setting, world_size 0: ValueError or TypeError", observe_traffic,
              judge_traffic_errors),
         answers=[Answer("fsdp_step_traffic", "function",
                         "a function fsdp_step_traffic(shapes, world_size, reshard_after_forward, param_bytes, "
                         "reduce_bytes) returning the bytes one rank receives, per collective kind")],
         points=3)


# --- Exercise 2: the HSDP mesh of a cluster -------------------------------------------------------------

MESH_PUBLIC = [[4, 2], [6, 3], [2, 2]]
MESH_PUBLIC_WANT = [
    {"shape": (2, 2), "shard_groups": [[0, 1], [0, 1], [2, 3], [2, 3]],
     "replicate_groups": [[0, 2], [1, 3], [0, 2], [1, 3]]},
    {"shape": (2, 3), "shard_groups": [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3,
     "replicate_groups": [[0, 3], [1, 4], [2, 5], [0, 3], [1, 4], [2, 5]]},
    {"shape": (1, 2), "shard_groups": [[0, 1], [0, 1]], "replicate_groups": [[0], [1]]},
]
MESH_BAD_PUBLIC = [[[6, 4], "ValueError"], [[4, 0], "ValueError"], [[4.0, 2], "TypeError"]]


def observe_meshes(ns):
    """``hsdp_mesh`` on MESH_PUBLIC and on MESH_BAD_PUBLIC, as ``observe_calls`` reports it."""
    from gpucourse.checks import observe_calls
    from gpucourse.checks.lesson17_fsdp2_in_practice import MESH_BAD_PUBLIC, MESH_PUBLIC, _calls_of_table

    return {"good": observe_calls(ns, "hsdp_mesh", _calls_of_table(MESH_PUBLIC)),
            "bad": observe_calls(ns, "hsdp_mesh", _calls_of_table([args for args, _ in MESH_BAD_PUBLIC]))}


def judge_meshes(d):
    from gpucourse.checks.lesson17_fsdp2_in_practice import MESH_PUBLIC, MESH_PUBLIC_WANT
    from gpucourse.checks.values import describe, type_words

    if not isinstance(d, dict) or len(d.get("good", [])) != len(MESH_PUBLIC):
        return "the answer was not called on every public case"
    for args, want, got in zip(MESH_PUBLIC, MESH_PUBLIC_WANT, d["good"]):
        where = f"hsdp_mesh({args[0]}, {args[1]})"
        if not isinstance(got, dict) or "returned" not in got:
            return f"{where} raised {got.get('raised', ['an exception'])[0] if isinstance(got, dict) else 'nothing'}"
        if type_words(got["returned"]) != "a dict":
            return f"{where} returned {type_words(got['returned'])}: return a dict with shape, shard_groups, replicate_groups"
        if got["returned"] != describe(want):
            return (f"{where} returned a wrong mesh: shape (replicate, shard) as a tuple, rank r's shard group the "
                    "ranks of its node, its replicate group the ranks at its place on every node")
    return None


def judge_mesh_errors(d):
    from gpucourse.checks.lesson17_fsdp2_in_practice import MESH_BAD_PUBLIC

    if not isinstance(d, dict) or len(d.get("bad", [])) != len(MESH_BAD_PUBLIC):
        return "the answer was not called on every public case"
    for (args, error), got in zip(MESH_BAD_PUBLIC, d["bad"]):
        raised = got.get("raised", []) if isinstance(got, dict) else []
        if error not in raised:
            did = f"raised {raised[0]}" if raised else "returned"
            return f"hsdp_mesh({args[0]!r}, {args[1]!r}) {did}; it must raise {error}"
    return None


register("hsdp_mesh",
         Case("4 ranks on nodes of 2, 6 on nodes of 3, one node: shape and groups", observe_meshes, judge_meshes),
         Case("nodes that do not divide, zero GPUs, a float: ValueError or TypeError", observe_meshes, judge_mesh_errors),
         answers=[Answer("hsdp_mesh", "function",
                         "a function hsdp_mesh(world_size, gpus_per_node) returning a dict with shape, "
                         "shard_groups and replicate_groups")],
         points=3)
