#!/usr/bin/env bash
# What issues 31 and 32 still need measured on an H200, as one device call, with the CuTe DSL's DSOs
# exported on this CPU machine first (the device then needs no DSL; about 10 MB travel):
#   bash bench/h200_next.sh --prepare     # here: .gpu/pre-attn and .gpu/pre-gate (8B-sized bundles are
#                                         # built under $PREP, default /tmp/h200-prep: ~40 GB, kept for reuse)
#   carry [".device/base", ".gpu"]   command: source .device/base/install.sh && bash bench/h200_next.sh "$OUT"
# On an H200, in this order, each part bounded so that all fit TOTAL_S (default 540 s), a log each in OUT:
#   1. issue 31, deliverable 1: the kernel per call against native at 1k/8k/32k (bench/attention_gpu.py
#      --parts kernel, the shipped split 32 x 4 and the variants never run on an H200: 6, 8, 10, 11)
#   2. issue 31, deliverable 2: the 8B gate a user runs at 32k, the kernel bound in all 36 layers
#      (bench/perf_gate_gpu.sh MODEL=8b GATES=cute-attention CONTEXT=32768, 3 pairs at most)
#   3. issue 32, deliverable 3: decode tokens/s and the roofline at 1k and 32k (bench/engine_gpu.py)
# PARTS (default attn,gate,engine) picks which run, in that order, when less device time is left: the
# parts named share TOTAL_S as above, a part alone gets all of it.
# Any other card: says which and stops (its numbers are in docs/gpu-results.md), so a call that landed on an
# H100 costs seconds, not minutes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
VARIANTS=${VARIANTS:-1,6,8,10,11}  # a subset of those prepared also runs
GATE_ENV=(MODEL=8b GATES=cute-attention CONTEXT=32768 TOKENS=64)

if [ "${1:-}" = --prepare ]; then
  PREP=${PREP:-/tmp/h200-prep}
  PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  export PATH="$(dirname "$PY"):$PATH"  # the scripts call python3 and `python3 -m mcore`
  mkdir -p "$PREP" .gpu/pre-attn .gpu/pre-gate/cute-attention
  set -e
  python3 bench/attention_gpu.py "$PREP/attn" --export-only --variants "$VARIANTS"
  cp "$PREP"/attn/prebuilt.json "$PREP"/attn/*.so .gpu/pre-attn/
  env "${GATE_ENV[@]}" DEVICE=cpu EXPORT_ONLY=1 bash bench/perf_gate_gpu.sh "$PREP/gate"
  cp "$PREP/gate/cute-attention/kernel.so" "$PREP/gate/cute-attention/abi" .gpu/pre-gate/cute-attention/
  du -sh .gpu/pre-attn .gpu/pre-gate
  exit 0
fi

OUT=${1:?usage: h200_next.sh OUT | --prepare}
mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: ${card:-none}"
case "$card" in
  *H200*) ;;
  *) echo "not an H200: nothing run (the H100's numbers are in docs/gpu-results.md)"; exit 0 ;;
esac
TOTAL_S=${TOTAL_S:-540}
t0=$SECONDS
left() { echo $((TOTAL_S - (SECONDS - t0))); }
export PYTHONUNBUFFERED=1 MCORE_CACHE_DIR=${MCORE_CACHE_DIR:-/tmp/mcore-cache} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
W=/tmp/h200-next
PARTS=${PARTS:-attn,gate,engine}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
# each part's share of what is left when it starts: the last part named takes all of it
share() {  # PART PERCENT
  local later=0 p
  for p in attn gate engine; do [ "$p" = "$1" ] && later=1 && continue; [ $later = 1 ] && has "$p" && { echo "$2"; return; }; done
  echo 100
}

# 1. the kernel table (about 2 minutes with the DSOs carried)
if has attn; then
timeout $(( $(left) * $(share attn 40) / 100 )) python3 bench/attention_gpu.py "$W/attn" --parts kernel --variants "$VARIANTS" \
  --no-flashinfer --rounds 5 --prebuilt .gpu/pre-attn > "$OUT/attn.log" 2>&1
echo "== attention (rc $?)"; grep -E '^\|' "$OUT/attn.log" | tail -n 12
fi

# 2. the 8B gate at 32k (a fresh process a run: about 26 s each on the H200)
if has gate; then
env "${GATE_ENV[@]}" RUNS=5 MAX_PAIRS=3 PREBUILT=.gpu/pre-gate timeout $(( $(left) * $(share gate 60) / 100 )) \
  bash bench/perf_gate_gpu.sh "$W/gate" > "$OUT/gate.log" 2>&1
echo "== gate (rc $?)"; grep -E 'PROMOTE|REJECT|INCONCLUSIVE|FAIL' "$OUT/gate.log" | tail -n 4
fi

# 3. the decode rates, with what time is left
if has engine; then
timeout $(( $(left) - 10 )) python3 bench/engine_gpu.py "$W/engine" --parts roofline,compiled --contexts 1024,32768 \
  --steps 20 --no-reload > "$OUT/engine.log" 2>&1
echo "== engine (rc $?)"; grep -E 'tok/s|roofline|kernels' "$OUT/engine.log" | tail -n 8
fi
echo "took $((SECONDS - t0)) s of TOTAL_S=$TOTAL_S"
