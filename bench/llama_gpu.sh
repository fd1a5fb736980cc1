#!/usr/bin/env bash
# Issue 28, item 5 in one device call (~7 min on the H200): a Llama-3.1-8B-sized bf16 model (random
# weights) against the Qwen3-8B-sized one in the engine benchmark, and all 32 Llama attention layers
# bound to the CuTe DSL kernel against native in lockstep. Needs the CuTe DSL (carried as for the
# qwen-attention stage of bench/gpu_session.sh). Each stage leaves its log in OUT.
#   source .device/base/install.sh && bash bench/llama_gpu.sh "$OUT" [engine,attention,qwen3]
# engine:    bench/engine_gpu.py --model llama3.1-8b: roofline, compiled engine (cold compile), ctx 1k, 32k
# attention: bench/attention_gpu.py --model llama3.1-8b --parts pipelines: the 32 slots bound to the
#            shipped split schedule, lockstep logits after a prompt, the step at 1k and 32k; reuses the
#            engine stage's native bundle and compiled cache (run it after engine)
# qwen3:     bench/engine_gpu.py --model qwen3-8b, the same parts: the reference rows
# Then one summary: ms/token and share of the roofline of both models at each context.
set -uo pipefail
OUT=${1:?usage: llama_gpu.sh OUT [stages]}
STAGES=${2:-engine,attention,qwen3}
CONTEXTS=${CONTEXTS:-1024,32768}
W=${W:-/tmp/llama-gpu}
mkdir -p "$OUT" "$W/qwen3"
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
unset PYTHONDONTWRITEBYTECODE
here=$(cd "$(dirname "$0")" && pwd)
has() { [[ ",$STAGES," == *",$1,"* ]]; }
ENGINE=(--parts roofline,compiled --contexts "$CONTEXTS" --extra-capacity "" --no-reload --steps 20)
t0=$(date +%s)
if has engine; then
  python3 "$here/engine_gpu.py" "$W" --model llama3.1-8b "${ENGINE[@]}" > "$OUT/engine-llama.log" 2>&1
  echo "engine llama3.1-8b: exit $? at $(( $(date +%s) - t0 )) s"; tail -n 12 "$OUT/engine-llama.log"
fi
if has attention; then
  MCORE_CACHE_DIR="$W/mcore-cache" TORCHINDUCTOR_CACHE_DIR="$W/mcore-cache/inductor" \
    python3 "$here/attention_gpu.py" "$W" --model llama3.1-8b --parts pipelines \
    --contexts "$CONTEXTS" --steps 10 --native "$W/native-llama3.1-8b-40960.bundle" > "$OUT/attention-llama.log" 2>&1
  echo "attention llama3.1-8b: exit $? at $(( $(date +%s) - t0 )) s"; tail -n 12 "$OUT/attention-llama.log"
  cp "$W/attention.json" "$OUT/attention-llama.json" 2>/dev/null
fi
if has qwen3; then
  python3 "$here/engine_gpu.py" "$W/qwen3" --model qwen3-8b "${ENGINE[@]}" > "$OUT/engine-qwen3.log" 2>&1
  echo "engine qwen3-8b: exit $? at $(( $(date +%s) - t0 )) s"; tail -n 8 "$OUT/engine-qwen3.log"
fi
cp "$W/engine_gpu.json" "$OUT/engine-llama.json" 2>/dev/null
cp "$W/qwen3/engine_gpu.json" "$OUT/engine-qwen3.json" 2>/dev/null
python3 "$here/compare_models.py" "$OUT/engine-llama.json" "$OUT/engine-qwen3.json" | tee "$OUT/summary.txt"
