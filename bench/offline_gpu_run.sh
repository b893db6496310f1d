#!/usr/bin/env bash
# `make test-gpu` on a GPU machine that has its own torch and no network (a cloud GPU box, a lab server):
# the notebook runtime comes as wheels, gpucourse from this checkout, and everything fits a time budget.
#
#   bench/offline_gpu_run.sh WHEELS OUT [BUDGET_SECONDS]
#
# WHEELS: a folder of wheels for what the machine lacks (nbclient, nbformat, ipykernel, Darts, and what they
# need; `pip download --no-deps`), installed with --no-deps into a folder of their own, never over its torch.
# OUT: where the results go: env.log (GPU, driver, versions, `python -m gpucourse doctor`), bench.log and
# reference-<gpu>.json (`bench-gpu`, full timing; reference-<gpu>.partial.json if a part failed or time ran
# out), tests.log and junit.xml (make test-gpu's tests), executed.tgz (every notebook as it ran).
#
# Unlike `make test-gpu`, the bench runs first: on a machine lent for minutes, the reference is what must
# come back. The two still never run together (the bench times the GPU). GPUCOURSE_COMMIT names the commit
# when the tree came without its git history. Exit 0 only if the bench wrote a reference and the tests passed.
set -u
WHEELS=${1:?usage: bench/offline_gpu_run.sh WHEELS OUT [BUDGET_SECONDS]}
OUT=${2:?usage: bench/offline_gpu_run.sh WHEELS OUT [BUDGET_SECONDS]}
BUDGET=${3:-540}
PY=${PYTHON:-python3}
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
mkdir -p "$OUT"

SITE=$(mktemp -d /tmp/gpucourse-site.XXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 2
export PYTHONPATH="$PWD/src:$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  "$PY" -c 'import sys, torch, torchvision, pytorch_lightning as pl; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "pl", pl.__version__, "tv", torchvision.__version__)'
  "$PY" -m gpucourse doctor; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

# The bench gets at most 45% of the budget; it writes what it measured after every part. GPU_BENCH=0 leaves
# it out (a second run that checks fixes), GPU_TESTS_K chooses tests (pytest -k).
bench=0
if [ "${GPU_BENCH:-1}" != 0 ]; then
  timeout -k 10 $(( BUDGET * 45 / 100 )) "$PY" -m gpucourse.bench_gpu --keep-going --out "$OUT/reference-gpu.json" 2>&1 \
    | tr '\r' '\n' | grep -v 'part/s\]' > "$OUT/bench.log"
  bench=${PIPESTATUS[0]}
  grep -E '^\[|^wrote|FAILED|failed|Error' "$OUT/bench.log" | tail -40
fi

tests=$(make -s --no-print-directory gpu-tests 2>/dev/null) || tests=$("$PY" - <<'PARSE'
import re
text = open("Makefile").read().replace("\\\n", " ")
print(re.search(r"^GPU_TESTS :=(.*)$", text, re.M).group(1).strip())
PARSE
)
GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 GPUCOURSE_REQUIRE=cuda timeout -k 20 $(( $(left) - 30 )) \
  "$PY" -m pytest -p no:cacheprovider -v -rs -m "not bench" -n "${GPU_WORKERS:-8}" --dist loadgroup --durations=25 \
  --junitxml "$OUT/junit.xml" ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} $tests > "$OUT/tests.log" 2>&1
status=$?
tar czf "$OUT/executed.tgz" build/executed 2>/dev/null
grep -E "FAILED|ERROR|SKIPPED|passed|failed" "$OUT/tests.log" | tail -40
echo "offline_gpu_run: bench exit $bench, tests exit $status, $(( $(date +%s) - start )) s of $BUDGET"
[ "$bench" -eq 0 ] && [ "$status" -eq 0 ]
