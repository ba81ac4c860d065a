#!/usr/bin/env bash
# The one prepared device check: every kernel benchmark on a GPU, each bounded in time, logs
# under ${OUT:-/tmp/jaxarena-bench}. Expects jax with CUDA installed (pip install -e ".[cuda]").
# Run from the repository root:  bash benchmarks/gpu_all.sh
set -uo pipefail
out="${OUT:-/tmp/jaxarena-bench}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$out/devices.txt"
run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
}
run fp8 150 python benchmarks/bench_fp8_block_quant.py
run splitk 200 python benchmarks/bench_splitk_decode_attention.py
run ssd 150 python benchmarks/bench_ssd_chunked_scan.py
run arena_views 60 python benchmarks/bench_arena_views.py --runs 200
