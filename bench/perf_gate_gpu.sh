#!/usr/bin/env bash
# Does the perf gate mean something on the GPU? (issue 8, deliverable 4) On demo:qwen3-tiny, bf16,
# CUDA, the default (compiled) engine, fresh-process pairs:
#   1. native vs native            -> every pair ratio within +-2%
#   2. native vs identity-copy slot -> PASS
#   3. native vs slow-copy slot     -> FAIL (a correct copy that repeats itself 512 times)
#   bash bench/perf_gate_gpu.sh OUT_DIR     (MCORE="python3 -m mcore"; PAIRS=6; TOKENS=64; GATES="...")
set -euo pipefail
OUT=${1:-artifacts/perf-gate-gpu}
MCORE=${MCORE:-python3 -m mcore}
PAIRS=${PAIRS:-6}
TOKENS=${TOKENS:-64}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of this script (CUDA kernels built only where a toolkit is)
CUDA=$([ "$DEVICE" = cpu ] && echo auto || echo on)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
trap 'echo "perf_gate_gpu.sh: line $LINENO failed; logs in $OUT" >&2' ERR
ARGS=(demo:qwen3-tiny --precision bf16 --max-cache-length 256 --decoder-engine-layout split)
BID=qwen.decode_logits_copy@1
$MCORE build "${ARGS[@]}" --device "$DEVICE" -o "$OUT/native.bundle" > "$OUT/build.log" 2>&1
$MCORE build "${ARGS[@]}" --device "$DEVICE" --recipe "$BID" decoder.logits_zero_bias -o "$OUT/slot.bundle" >> "$OUT/build.log" 2>&1
ABI=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["abi_sha256"])' "$OUT/slot.selection.json")
for k in identity-copy slow-copy; do
  mkdir -p "$OUT/$k"
  $MCORE kernel build "$k" -o "$OUT/$k/kernel.so" --cuda "$CUDA" --force > "$OUT/$k/kernel.log" 2>&1
  printf '{"schema_version": 1, "bindings": [{"id": "%s", "abi_sha256": "%s", "library": "./kernel.so", "function": "run"}]}\n' \
    "$BID" "$ABI" > "$OUT/$k/bindings.json"
done
BENCH="--device $DEVICE --prompt 'x y z' --max-new-tokens $TOKENS --greedy --ignore-eos --warmup 2 --benchmark 5"
NATIVE="$MCORE run $OUT/native.bundle $BENCH"
# one run of each first fills the compiled-code cache, so no pair pays for a compile
bash -c "$NATIVE" > "$OUT/warm.log" 2>&1 || { tail -n 5 "$OUT/warm.log" >&2; exit 1; }
gate() {  # NAME EXTERNAL_CMD
  $MCORE verify perf --pairs "$PAIRS" --warmup 1 --min-ratio 0.98 --native "$NATIVE" --external "$2" \
    > "$OUT/gate-$1.txt" 2>&1 || true
  echo "== $1"; grep -E 'pair [0-9]+/|PASS|FAIL' "$OUT/gate-$1.txt"
}
# each gate is 2 x PAIRS fresh processes, each reloading the compiled engine from its cache: run
# them in separate device calls where one call's time limit is short (GATES=slow-copy ...)
for g in ${GATES:-native-vs-native identity-copy slow-copy}; do
  case $g in
    native-vs-native) gate "$g" "$NATIVE" ;;
    identity-copy|slow-copy) gate "$g" "$MCORE run $OUT/slot.bundle --kernel-bindings $OUT/$g/bindings.json $BENCH" ;;
    *) echo "perf_gate_gpu.sh: unknown gate $g (native-vs-native, identity-copy, slow-copy)" >&2; exit 2 ;;
  esac
done
