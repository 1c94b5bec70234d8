#!/usr/bin/env bash
# One call on the lent GPU machine: set up kfoundry there, then run the named steps, logging to $OUT.
#   bash benchmarks/cuda_gpu_session.sh setup tests devices faults compile small spaces examples
# Needs the wheels in .whl/ (pydantic & co., see benchmarks/NOTES.md) carried with the call.
set -u
OUT=${OUT:-/tmp/kf-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KF_PEAKS_FILE="$OUT/peaks.json" TORCHINDUCTOR_COMPILE_THREADS=16
KF=(python3 -c "from kfoundry.core.cli import main; main()")
step() { echo; echo "=== $1 ($(date +%T))"; }

setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -m pip list 2>/dev/null | grep -i -E "^(cuda|nvidia-cuda-nvrtc|pydantic|pluggy|click|rich|numpy|setuptools) " | tr '\n' ';'; echo
  nvcc --version | tail -1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site
  python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/kfw . >/dev/null || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/kfw/kfoundry-*.whl || return 1
  rm -rf /tmp/site/kfoundry   # metadata (entry points) from the wheel, code from this tree
  export PYTHONPATH="$PWD:/tmp/site"
  python3 -c "import kfoundry, pydantic; from kfoundry.core.plugins import get_plugin_manager as g; m = g(); print(kfoundry.__file__, 'pydantic', pydantic.VERSION, 'backends', m.registry('backend').names(), 'executors', m.registry('executor').names())" 2>&1 | grep -v Warning
  python3 -c "from kfoundry.plugins.backends.cuda import CudaBackend as B; b = B(); print(b.capabilities(), '|', b.toolchain_version())"
}

for s in "$@"; do
  step "$s"
  case "$s" in
    setup) setup || { echo "setup failed"; exit 1; } ;;
    gputests) timeout 120 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_cuda_gpu.py 2>&1 | tail -15 ;;
    tests) timeout 240 python3 -m pytest -q -p no:cacheprovider -W ignore tests/test_cuda_gpu.py tests/test_cuda_backend.py tests/test_devices.py tests/test_nvidia_hardware.py 2>&1 | tail -25 ;;
    devices) timeout 120 "${KF[@]}" devices --measure --json > "$OUT/devices.json"; "${KF[@]}" devices 2>&1 | grep -v -i warning ;;
    faults) timeout 200 python3 benchmarks/cuda_faults.py --json "$OUT/faults.json" 2>&1 | grep -v Warning ;;
    compile) timeout 240 python3 benchmarks/cuda_compile_latency.py --inline "${INLINE:-2}" --json "$OUT/compile.json" 2>&1 | grep -v Warning ;;
    small) timeout 240 python3 benchmarks/cuda_examples.py --small --no-compile --no-inprocess --trials 2 --timeout 60 --json "$OUT/small.json" 2>&1 | grep -v Warning ;;
    spaces) timeout "${SPACES_TIMEOUT:-330}" python3 benchmarks/cuda_record_spaces.py --out "$OUT/spaces" 2>&1 | grep -v Warning ;;
    examples) timeout "${EXAMPLES_TIMEOUT:-540}" python3 benchmarks/cuda_examples.py ${ONLY:+--only $ONLY} --json "$OUT/examples.json" --markdown "$OUT/examples.md" 2>&1 | grep -v Warning ;;
    timer) timeout 200 python3 benchmarks/cuda_examples.py --skip-eval --json "$OUT/timer.json" --markdown "$OUT/timer.md" 2>&1 | grep -v Warning ;;
    inline) timeout "${INLINE_TIMEOUT:-300}" python3 benchmarks/cuda_examples.py --only gelu --inline --no-compile --json "$OUT/inline.json" 2>&1 | grep -v Warning ;;
    offline) timeout "${OFFLINE_TIMEOUT:-480}" python3 benchmarks/cuda_offline.py --out /tmp/kf-runs --wall "${OFFLINE_WALL:-30}" --generations 2 ${ONLY:+--only $ONLY} --json "$OUT/offline.json" 2>&1 | grep -v -i warning ;;
    cheats) timeout "${CHEATS_TIMEOUT:-420}" python3 benchmarks/cuda_trust_cheats.py ${ONLY:+--only $ONLY} --json "$OUT/cheats.json" 2>&1 | grep -v Warning ;;
    trust) timeout "${TRUST_TIMEOUT:-420}" python3 benchmarks/cuda_trust_timer.py ${ONLY:+--only $ONLY} --json "$OUT/trust.json" 2>&1 | grep -v Warning ;;
    checkcost) timeout 240 python3 benchmarks/check_cost.py --device cuda --shape batch_size=4096 --shape dim=393216 2>&1 | grep -v Warning ;;
    *) echo "unknown step $s" ;;
  esac
done
echo "=== done ($(date +%T))"
