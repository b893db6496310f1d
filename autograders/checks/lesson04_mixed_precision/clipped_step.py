"""Hidden checks for lesson 4: clipped_step (the package's docstring says how every part works)."""

import functools



# --- clipped_step ---------------------------------------------------------------------------
# What the exercise text and answer line require, for one step:
#  1. zero the gradients first (the step after another must not add the old gradients) -> "two steps
#     in a row ..." (the second step's parameters); gradients already there at the first step (cases 1, 3)
#  2. output and cross-entropy loss under torch.autocast(device_type, dtype=dtype), the device type and
#     dtype given (bfloat16 too, and 'cuda'); backward of scaler.scale(loss) outside it -> "autocast with
#     the device type and dtype given ..." and "generated sizes ..." (parameters equal the reference's)
#  3. scaler.unscale_(optimizer) after backward and before clipping, so that the clip sees the true
#     gradients -> public cases, and "generated sizes ..." with max_norm below and above the true norm
#  4. clip the total norm of all the model's gradients to max_norm -> "generated sizes ..." (cases 2 and 3:
#     an optimizer of two parameter groups)
#  5. scaler.step(optimizer), then scaler.update() -> public order case; "an overflowing step ..."
#     (the scale backs off, and the next step does not raise)
#  6. return the total norm before clipping, a float; on an overflowing step it is inf or nan and
#     the step is skipped -> "generated sizes ..." and "an overflowing step ..."

def draw_clipped(rng):
    """A seed for 4 models and their batches, and each model's autocast dtype (float16 or bfloat16 on the
    CPU), drawn at grading time: the judge rebuilds them from the same seed."""
    return {"seed": rng.randrange(1 << 30), "dtypes": [rng.choice(["float16", "bfloat16"]) for _ in range(4)]}


def observe_clipped_generated(ns, drawn):
    """``ns``'s clipped_step twice in a row on 4 generated models: norms, parameters, scale. The judge runs
    this same observer on the grader's side with reference_clipped_step (clipped_generated_expected)."""
    import copy
    import random

    import torch
    from torch import nn
    from gpucourse.checks import answer

    def _optimizer(model, case):
        """SGD over all the model's parameters: one group, or (cases 2 and 3) two groups of their own
        learning rates: "all the model's gradients" are every group's."""
        if case < 2:
            return torch.optim.SGD(model.parameters(), lr=0.2)
        first, *rest = list(model.children())
        return torch.optim.SGD([{"params": first.parameters(), "lr": 0.2},
                                {"params": [p for m in rest for p in m.parameters()], "lr": 0.1}])

    def _stale_gradients(model, data, case):
        """Cases 1 and 3 start with gradients already there (a backward nobody stepped): the step zeroes them first."""
        if case % 2 == 1:
            nn.functional.cross_entropy(model(data[1][0] * 3), data[1][1]).backward()

    # the judge computes in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        rng = random.Random(drawn["seed"])
        result = []
        for case in range(4):
            width, batch, classes = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 5)
            torch.manual_seed(drawn["seed"] + case)
            model = nn.Sequential(nn.Linear(5, width), nn.GELU(), nn.Linear(width, classes))
            data = [(torch.randn(batch, 5) * rng.uniform(0.5, 4), torch.randint(0, classes, (batch,))) for _ in range(2)]
            probe = copy.deepcopy(model)
            nn.functional.cross_entropy(probe(data[0][0]), data[0][1]).backward()
            true_norm = float(torch.cat([p.grad.flatten() for p in probe.parameters()]).norm())
            max_norm = true_norm * (rng.uniform(0.05, 0.5) if case % 2 == 0 else rng.uniform(2, 5))
            init_scale = 2.0 ** rng.randint(6, 14)
            optimizer = _optimizer(model, case)
            _stale_gradients(model, data, case)
            scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
            norms, params, is_float = [], [], True
            for inputs, targets in data:
                dtype = getattr(torch, drawn["dtypes"][case])
                value = answer(ns, "clipped_step")(model, inputs, targets, optimizer, scaler, "cpu", dtype, max_norm)
                is_float = is_float and isinstance(value, float)
                norms.append(float(value) if isinstance(value, (int, float, torch.Tensor)) else None)
                params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist())
            result.append({"is_float": is_float, "norms": norms, "params": params, "scale": float(scaler.get_scale()),
                           "width": width, "batch": batch, "max_norm": max_norm, "clips": case % 2 == 0,
                           "dtype": drawn["dtypes"][case]})
        return result
    finally:
        torch.set_float32_matmul_precision(precision)


def reference_clipped_step(model, inputs, targets, optimizer, scaler, device_type, dtype, max_norm):
    import torch
    from torch import nn
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(norm)


@functools.lru_cache(maxsize=64)  # the cases of one submission judge the same draw
def clipped_generated_expected(seed: int, dtypes: tuple[str, ...]) -> list[dict]:
    """What the student's steps must give: observe_clipped_generated run here, on the same seed, with the
    grader's own correct clipped AMP step. The grader's random state is kept."""
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator

    with global_rng():
        return observe_clipped_generated({"clipped_step": reference_clipped_step}, {"seed": seed, "dtypes": list(dtypes)})


def _max_gap(got, want):
    if not isinstance(got, list) or len(got) != len(want):
        return float("inf")
    return max((abs(a - b) for a, b in zip(got, want)), default=0.0)


def judge_clipped_generated(d, drawn):
    expected = clipped_generated_expected(drawn["seed"], tuple(drawn["dtypes"]))
    if len(d) != len(expected):
        return f"{len(d)} of {len(expected)} models observed"
    for got, r in zip(d, expected):
        where = f"a {r['width']}-wide model in {r['dtype']}, batch {r['batch']}, max_norm {r['max_norm']:.3g}" + (
            " (below the gradients' norm)" if r["clips"] else " (above it)")
        if not got["is_float"]:
            return f"{where}: clipped_step must return a float"
        if len(got["norms"]) != 2 or len(got["params"]) != 2:
            return f"{where}: two steps expected"
        if got["norms"][0] is None or not abs(got["norms"][0] - r["norms"][0]) <= 1e-3 * r["norms"][0]:
            return f"{where}: returned {got['norms'][0]}, not the true gradient norm before clipping"
        if not _max_gap(got["params"][0], r["params"][0]) <= 1e-5:
            return f"{where}: the parameters after one step differ from a correct clipped AMP step"
        norm_close = abs((got["norms"][1] or 0) - r["norms"][1]) <= 1e-3 * r["norms"][1]
        if not _max_gap(got["params"][1], r["params"][1]) <= 1e-5 or not norm_close:
            return f"{where}: two steps in a row: the second step differs (are the gradients zeroed each step?)"
        if got["scale"] != r["scale"]:
            return f"{where}: the scale after two good steps is {got['scale']:g}, expected {r['scale']:g}"
    return None


def observe_clipped_overflow(ns):
    import math

    import torch
    from torch import nn
    from gpucourse.checks import answer

    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # scaled float16 gradients overflow to inf
    inputs, targets = torch.randn(5, 4), torch.randint(0, 3, (5,))
    before = [p.detach().clone() for p in model.parameters()]
    steps = []
    for _ in range(2):
        scale = float(scaler.get_scale())
        value = answer(ns, "clipped_step")(model, inputs, targets, optimizer, scaler, "cpu", torch.float16, 1.0)
        number = float(value) if isinstance(value, (int, float, torch.Tensor)) else None
        steps.append({"scale_before": scale, "scale_after": float(scaler.get_scale()),
                      "finite": None if number is None else math.isfinite(number),
                      "unchanged": all(torch.equal(a, b) for a, b in zip(before, model.parameters()))})
    return steps


def judge_clipped_overflow(d):
    if len(d) != 2:
        return f"{len(d)} of 2 overflowing steps observed"
    for number, s in enumerate(d, 1):
        if not s["unchanged"]:
            return f"overflowing step {number}: the parameters changed; scaler.step must skip a step with inf/NaN gradients"
        if s["finite"] is not False:
            return f"overflowing step {number}: the norm returned should be inf or nan (the gradients overflowed)"
        if s["scale_after"] != s["scale_before"] / 2:
            return f"overflowing step {number}: scale {s['scale_before']:g} became {s['scale_after']:g}, not halved"
    return None


CLIP_AUTOCAST_RUNS = [("cpu", "torch.bfloat16"), ("cpu", "torch.float16"), ("cuda", "torch.bfloat16")]


def observe_clipped_autocast(ns):
    """Where autocast was on, with which dtype, in the forward and in the backward; which autocast the
    answer made (device type, dtype). bfloat16 on the CPU costs little at these sizes."""
    import warnings

    import torch
    from torch import nn
    from gpucourse.checks import answer

    runs, entered = [], []

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))

        def forward(self, x):
            runs[-1]["forwards"].append({"autocast": torch.is_autocast_enabled("cpu"),
                                         "dtype": str(torch.get_autocast_dtype("cpu"))})
            out = self.net(x)
            if out.requires_grad:
                out.register_hook(lambda grad: runs[-1]["backwards"].append(torch.is_autocast_enabled("cpu")))
            return out

    autocast = torch.amp.autocast_mode.autocast
    real_init = autocast.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        entered.append([str(self.device), str(self.fast_dtype)])

    g = torch.Generator().manual_seed(45)
    inputs, targets = torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)
    autocast.__init__ = recording_init
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast('cuda') without CUDA says it disables itself
            for device_type, dtype in [("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.bfloat16)]:
                torch.manual_seed(45)
                model = Recorded()
                runs.append({"forwards": [], "backwards": []})
                entered.clear()
                answer(ns, "clipped_step")(model, inputs, targets, torch.optim.SGD(model.parameters(), lr=0.1),
                                           torch.amp.GradScaler("cpu", init_scale=256.0), device_type, dtype, 1.0)
                runs[-1]["autocast"] = [list(a) for a in entered]
    finally:
        autocast.__init__ = real_init
    return runs


def judge_clipped_autocast(d):
    if len(d) != len(CLIP_AUTOCAST_RUNS):
        return f"{len(d)} of {len(CLIP_AUTOCAST_RUNS)} steps observed"
    for (device_type, dtype), run in zip(CLIP_AUTOCAST_RUNS, d):
        where = f"clipped_step(..., {device_type!r}, {dtype}, ...)"
        if not run["autocast"] or any(a != [device_type, dtype] for a in run["autocast"]):
            return f"{where}: autocast must get the device type and dtype passed in, got {run['autocast']}"
        if device_type == "cpu":
            if len(run["forwards"]) != 1 or not all(f["autocast"] and f["dtype"] == dtype for f in run["forwards"]):
                return f"{where}: the forward pass did not run (once) under autocast to {dtype}"
        if len(run["backwards"]) != 1:
            return f"{where}: {len(run['backwards'])} backward passes through the model in one step"
        if any(run["backwards"]):
            return f"{where}: backward ran inside autocast: backpropagate scaler.scale(loss) outside it"
    return None
