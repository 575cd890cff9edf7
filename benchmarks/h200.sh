#!/usr/bin/env bash
# Everything that needs the H200, run there from the repo root after `source .device/prelude.sh`:
#   benchmarks/h200.sh OUT_DIR [tests] [ops] [steps] [tune]
# tests: the gpu-marked pytest suite; ops / steps: the benchmark runners; tune: `make tune`-equivalent on CUDA.
# fla-core (a wheel in .device/, see README "GPU work") is installed for the delta-rule baseline when present;
# .device/bench.tar.xz (`make bench-prebuild` here) holds prebuilt CUDA modules: then nothing compiles there.
set -uo pipefail
out=${1:?usage: benchmarks/h200.sh OUT_DIR [tests] [ops] [steps] [tune]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1  # maps schedules/ into the package
if compgen -G ".device/fla_core-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target .device/extra .device/fla_core-*.whl &&
        export PYTHONPATH="$PWD/.device/extra:$PYTHONPATH"
fi
library=()
if [ -f .device/bench.tar.xz ]; then
    mkdir -p build && tar xJf .device/bench.tar.xz -C build && library=(--library build/bench)
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests ops steps)
status=0
for part in "${parts[@]}"; do
    case $part in
    tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log" || status=1 ;;
    ops) python3 -m benchmarks.run ${library[@]+"${library[@]}"} --out "$out/h200_ops.json" 2>&1 | tee "$out/bench_ops.log" || status=1 ;;
    steps) python3 -m benchmarks.steps ${library[@]+"${library[@]}"} --out "$out/h200_steps.json" 2>&1 | tee "$out/bench_steps.log" || status=1 ;;
    tune)
        python3 -m gdn_tvm.tune --target cuda 2>&1 | tee "$out/tune.log" || status=1
        tar czf "$out/tuning_logs_cuda.tgz" tuning_logs/cuda
        ;;
    *) echo "unknown part $part" >&2; status=2 ;;
    esac
done
exit $status
