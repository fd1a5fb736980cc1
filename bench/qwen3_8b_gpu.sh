#!/usr/bin/env bash
# GPU evidence (issue 3): a Qwen3-8B-sized config with seeded random weights, bf16, on CUDA.
# Native vs identity-copy slot: token equality, the perf gate (fresh-process pairs), tokens/s,
# and transformers eager greedy tokens/s on the same config as the baseline.
#   bash bench/qwen3_8b_gpu.sh OUT_DIR     (MCORE="python3 -m mcore" by default; PAIRS, TOKENS, CACHE)
set -euo pipefail
OUT=${1:-artifacts/qwen3-8b-gpu}
MCORE=${MCORE:-python3 -m mcore}
PAIRS=${PAIRS:-2}
TOKENS=${TOKENS:-64}
CACHE=${CACHE:-40960}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
python3 -c "import sys; sys.path.insert(0, '$here'); from qwen3_8b_config import write_config_folder; from pathlib import Path; write_config_folder(Path('$OUT/qwen3-8b-config'))"
# Random weights need no checkpoint, but runs need a tokenizer: borrow the demo's byte-level one
# (ids past its vocabulary decode to nothing; token IDs are what the gates compare).
python3 -c "import shutil; from mcore.families.demo import materialize; shutil.copy(materialize('qwen3-tiny') / 'tokenizer.json', '$OUT/qwen3-8b-config/')"
ARGS=("$OUT/qwen3-8b-config" --weights random --seed 0 --precision bf16 --max-cache-length "$CACHE" --decoder-engine-layout split)
BID=qwen.decode_logits_copy@1
t0=$(date +%s)
$MCORE build "${ARGS[@]}" --device cuda -o "$OUT/native.bundle" > "$OUT/build-native.log" 2>&1
$MCORE build "${ARGS[@]}" --device cuda --recipe "$BID" decoder.logits_zero_bias -o "$OUT/slot.bundle" > "$OUT/build-slot.log" 2>&1
$MCORE kernel build identity-copy -o "$OUT/kernel.so" --cuda on > "$OUT/kernel.log" 2>&1
ABI=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["abi_sha256"])' "$OUT/slot.selection.json")
printf '{"schema_version": 1, "bindings": [{"id": "%s", "abi_sha256": "%s", "library": "./kernel.so", "function": "run"}]}\n' "$BID" "$ABI" > "$OUT/kernel-bindings.json"
echo "builds: $(( $(date +%s) - t0 )) s"
P='Explain grouped-query attention, KV caching, and decode latency.'
$MCORE run "$OUT/native.bundle" --device cuda --prompt "$P" --max-new-tokens "$TOKENS" --greedy --ignore-eos \
  --output "$OUT/native.jsonl" > "$OUT/run-native.log" 2>&1
$MCORE run "$OUT/slot.bundle" --device cuda --kernel-bindings "$OUT/kernel-bindings.json" --prompt "$P" \
  --max-new-tokens "$TOKENS" --greedy --ignore-eos --output "$OUT/external.jsonl" > "$OUT/run-slot.log" 2>&1
$MCORE verify tokens "$OUT/native.jsonl" "$OUT/external.jsonl" | tee "$OUT/tokens-gate.txt" || true
BENCH="--device cuda --prompt 'x y z' --max-new-tokens $TOKENS --greedy --ignore-eos --warmup 2 --benchmark 5"
$MCORE verify perf --pairs "$PAIRS" --warmup 0 --min-ratio 0.98 \
  --native "$MCORE run $OUT/native.bundle $BENCH" \
  --external "$MCORE run $OUT/slot.bundle --kernel-bindings $OUT/kernel-bindings.json $BENCH" | tee "$OUT/perf-gate.txt" || true
python3 "$here/transformers_baseline.py" "$OUT/qwen3-8b-config" --tokens "$TOKENS" | tee "$OUT/transformers.txt"
echo "== summary (Qwen3-8B-sized, random weights, bf16, cache $CACHE, $TOKENS tokens)"
echo "tokens gate: $(tail -n 1 "$OUT/tokens-gate.txt")"
grep -h 'tokens_per_sec' "$OUT/perf-gate.txt" | tail -n 4 || true
echo "perf gate:   $(tail -n 1 "$OUT/perf-gate.txt")"
echo "transformers: $(tail -n 1 "$OUT/transformers.txt")"
