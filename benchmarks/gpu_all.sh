#!/usr/bin/env bash
# The one prepared device check: compile-time predictions and real-GPU figures in one call
# (at most 10 minutes: the time limits below add up to 600 s), logs under
# ${OUT:-/tmp/jaxarena-bench}. Expects jax with CUDA installed (pip install -e ".[cuda13]", or
# ".[cuda]"). Run from the repository root:  bash benchmarks/gpu_all.sh
#   1. predicted: the CI gate's footprint/launch/register figures, compiled for an H200 without
#      using the GPU (JAX_PLATFORMS=cpu, deviceless; benchmarks/gpu_compile_figures.py);
#   2. real: the copy bandwidth (a plain XLA a + 1 over 1 GiB) and every kernel's achieved GB/s
#      against it, with the real compile's temp/alias bytes and launches
#      (benchmarks/gpu_bandwidth.py): compare its footprint column with step 1's;
#   3. the per-kernel benchmarks against their XLA baselines;
#   4. step-report's modeled decode time beside the measured one (benchmarks/step_time.py:
#      Qwen3-8B cut to 2 layers, batch 1 and 8, 1024 tokens of context).
set -uo pipefail
out="${OUT:-/tmp/jaxarena-bench}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$out/devices.txt"
nvidia-smi --query-gpu=name,clocks.max.mem,memory.total --format=csv 2>/dev/null | tee -a "$out/devices.txt"
run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  echo "== $name: $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
}
run predicted_h200 150 env JAX_PLATFORMS=cpu python benchmarks/gpu_compile_figures.py \
  --target h200 --only fp8 splitk hybrid
run real_bandwidth 150 python benchmarks/gpu_bandwidth.py
run fp8 60 python benchmarks/bench_fp8_block_quant.py --m 16 4096
run splitk 120 python benchmarks/bench_splitk_decode_attention.py
run ssd 60 python benchmarks/bench_ssd_chunked_scan.py
run arena_views 30 python benchmarks/bench_arena_views.py --runs 200
run step_time 30 python benchmarks/step_time.py --layers 2 --batch 1 8 --min-seconds 0.2
