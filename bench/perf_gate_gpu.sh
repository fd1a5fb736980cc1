#!/usr/bin/env bash
# Does the perf gate mean something on the GPU? On demo:qwen3-tiny, bf16, CUDA, the default
# (compiled) engine, fresh-process pairs, `mcore verify perf` with its interval rule (issue 26):
#   native-vs-native  -> PROMOTE or INCONCLUSIVE, never REJECT
#   identity-copy     -> what a slot boundary costs (on this 50 us step, about 1 us: REJECT, rightly)
#   slow-copy         -> REJECT (a correct copy that repeats itself 512 times)
#   cute-attention    -> the CuTe DSL decode attention bound in every layer (issue 31: MODEL=8b, split
#                        schedule with its workspace; the kernel compiles for sm_90a, so CUDA only)
#   and `mcore verify logits` native vs identity-copy: bit-identical logits in lockstep
# GATES names the gates in the order they run, NAME:COUNT runs one COUNT times, e.g. the issue's evidence:
#   GATES="native-vs-native:6 slow-copy:3" bash bench/perf_gate_gpu.sh OUT
# (a name may come again, "native-vs-native:2 slow-copy:1 native-vs-native:2", so that a run cut short has both)
# Gates run side by side, one per GPU (each fresh process reloads the compiled engine, about 20-26 s
# on the H200 box: 9 gates one after another take longer than one device call); NGPU=1 runs them in turn.
#   (MCORE="python3 -m mcore"; PAIRS=auto|N; MAX_PAIRS=4; TOKENS=128; RUNS=30; METRIC=device|min-step|throughput;
#    MODEL=tiny|8b; CONTEXT="N ...": a prompt of about N tokens, so decode runs at that context, each
#    gate run at every context named (one cache capacity for all, the largest's: one build, one compile);
#    DEVICE=cpu: a smoke run of this script; EXPORT_ONLY=1: stop after the bundles and DSOs, which
#    PREBUILT=that OUT on another machine uses where its receipts have the same ABI: the CuTe DSL
#    exports for sm_90a without a GPU, so a GPU call then needs no DSL)
set -euo pipefail
OUT=${1:-artifacts/perf-gate-gpu}
MCORE=${MCORE:-python3 -m mcore}
PAIRS=${PAIRS:-auto}
MAX_PAIRS=${MAX_PAIRS:-4}
TOKENS=${TOKENS:-128}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of this script (CUDA kernels built only where a toolkit is)
CUDA=$([ "$DEVICE" = cpu ] && echo auto || echo on)
GATES=${GATES:-native-vs-native identity-copy slow-copy}
for spec in $GATES; do  # every gate named and possible before anything is built or written
  case ${spec%%:*} in
    native-vs-native|identity-copy|slow-copy) ;;
    cute-attention) [ "${MODEL:-tiny}" = 8b ] || { echo "perf_gate_gpu.sh: cute-attention needs MODEL=8b (head_dim 128)" >&2; exit 2; } ;;
    *) echo "perf_gate_gpu.sh: unknown gate ${spec%%:*} (native-vs-native, identity-copy, slow-copy, cute-attention)" >&2; exit 2 ;;
  esac
done
CONTEXT=${CONTEXT:-}
CONTEXTS=(${CONTEXT//,/ })  # "1024 8192 32768" or "1024,8192,32768"
for n in "${CONTEXTS[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "perf_gate_gpu.sh: CONTEXT=$CONTEXT: $n is not a token count (whole numbers, at least 1)" >&2; exit 2; }
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
trap 'echo "perf_gate_gpu.sh: line $LINENO failed; logs in $OUT" >&2' ERR
# fresh processes read Python's bytecode from a cache instead of compiling torch's sources each time
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
unset PYTHONDONTWRITEBYTECODE
ARGS=(demo:qwen3-tiny --precision bf16 --max-cache-length 256 --decoder-engine-layout split)
if [ "${MODEL:-tiny}" = 8b ]; then  # MODEL=8b: the Qwen3-8B-sized config, random weights (a 5 ms step, not 50 us)
  [ -d "$OUT/cfg" ] || python3 -c "import sys; sys.path.insert(0, '$(dirname "$0")'); from pathlib import Path; import shutil; \
from qwen3_8b_config import write_config_folder; from mcore.families.demo import materialize; \
d = write_config_folder(Path('$OUT/cfg')); shutil.copy(materialize('qwen3-tiny') / 'tokenizer.json', d)"
  ARGS=("$OUT/cfg" --weights random --precision bf16 --max-cache-length 4096 --decoder-engine-layout split)
fi
declare -A PROMPTS=([-]="x y z")  # context -> prompt ("-": no CONTEXT, the short prompt)
ORDER=(-)
if [ ${#CONTEXTS[@]} -gt 0 ]; then  # decode at about each context (an OUT of its own: bundles are reused)
  TOKENIZER=$([ "${MODEL:-tiny}" = 8b ] && echo "$OUT/cfg/tokenizer.json" || python3 -c \
    "from mcore.families.demo import materialize; print(materialize('qwen3-tiny') / 'tokenizer.json')")
  ORDER=("${CONTEXTS[@]}")
  most=0
  for n in "${CONTEXTS[@]}"; do
    PROMPTS[$n]=$(python3 "$(dirname "$0")/context_prompt.py" "$n" "$TOKENIZER")
    [ "$n" -gt "$most" ] && most=$n
  done
  for i in "${!ARGS[@]}"; do  # --max-cache-length: the longest prompt, the new tokens, a margin
    [ "${ARGS[$i]}" = --max-cache-length ] && ARGS[$((i + 1))]=$(( most + TOKENS + 64 ))
  done
fi
PROMPT=${PROMPTS[${ORDER[0]}]}
BID=qwen.decode_logits_copy@1
# what an earlier call of this script left in OUT is reused (the device keeps /tmp while warm; bundles are files)
[ -e "$OUT/native.bundle" ] || $MCORE build "${ARGS[@]}" --device "$DEVICE" -o "$OUT/native.bundle" > "$OUT/build.log" 2>&1
if [[ "$GATES" == *copy* ]]; then
  [ -e "$OUT/slot.bundle" ] || $MCORE build "${ARGS[@]}" --device "$DEVICE" --recipe "$BID" decoder.logits_zero_bias \
    -o "$OUT/slot.bundle" >> "$OUT/build.log" 2>&1
  ABI=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["abi_sha256"])' "$OUT/slot.selection.json")
fi
# A tiny model's decode step takes about 0.1 ms on the H200: 5 runs of 64 tokens measured 32 ms per
# process and pair ratios spread 0.94-1.32 (2026-12-01). RUNS x TOKENS sets the measured window.
bench() {  # the arguments every timed run takes, at the prompt $PROMPT
  echo "--device $DEVICE --prompt '$PROMPT' --max-new-tokens $TOKENS --greedy --ignore-eos --warmup 2 --benchmark ${RUNS:-30}"
}
NATIVE="$MCORE run $OUT/native.bundle"  # each command without its bench() arguments
declare -A EXT=([native-vs-native]="$NATIVE")
warm() {  # NAME CMD: one unmeasured run fills the compiled-code cache, so no measured run pays for a compile
  bash -c "$2" > "$OUT/warm-$1.log" 2>&1 || { tail -n 5 "$OUT/warm-$1.log" >&2; exit 1; }
}
# METRIC=device (CUDA's default, what --metric auto picks there): the device time per decode step each
# run prints (device_step_ms); the wall-clock tokens/s of a 0.1 ms step varied +-15% between processes
METRIC=${METRIC:-$([ "$DEVICE" = cpu ] && echo auto || echo device)}
for spec in $GATES; do  # kernels and bindings before any gate is timed
  g=${spec%%:*}
  case $g in
    native-vs-native) ;;
    identity-copy|slow-copy)
      [ -n "${EXT[$g]:-}" ] && continue
      mkdir -p "$OUT/$g"
      [ -f "$OUT/$g/kernel.so" ] || $MCORE kernel build "$g" -o "$OUT/$g/kernel.so" --cuda "$CUDA" --force > "$OUT/$g/kernel.log" 2>&1
      printf '{"schema_version": 1, "bindings": [{"id": "%s", "abi_sha256": "%s", "library": "./kernel.so", "function": "run"}]}\n' \
        "$BID" "$ABI" > "$OUT/$g/bindings.json"
      EXT[$g]="$MCORE run $OUT/slot.bundle --kernel-bindings $OUT/$g/bindings.json" ;;
    cute-attention)
      [ -n "${EXT[$g]:-}" ] && continue
      mkdir -p "$OUT/$g"
      ATTN=qwen.decode_attention_region@2
      # the split schedule's workspace: 32 splits of every head's fp32 (context row, max, sum)
      WS=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); d=c.get("head_dim") or c["hidden_size"]//c["num_attention_heads"]; print(c["num_attention_heads"]*32*(d+2)*4)' "$OUT/cfg/config.json")
      [ -e "$OUT/attn.bundle" ] || $MCORE build "${ARGS[@]}" --device "$DEVICE" --recipe "$ATTN" all-instances \
        --workspace-bytes "$WS" -o "$OUT/attn.bundle" >> "$OUT/build.log" 2>&1
      RECEIPT="$OUT/attn.selection.decoder.layers.0.decode_attention.json"
      AABI=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["abi_sha256"])' "$RECEIPT")
      if [ ! -f "$OUT/$g/kernel.so" ] && [ -n "${PREBUILT:-}" ]; then  # exported elsewhere for this receipt's ABI
        if [ "$(cat "$PREBUILT/$g/abi" 2>/dev/null)" = "$AABI" ]; then
          cp "$PREBUILT/$g/kernel.so" "$OUT/$g/kernel.so" && echo "$g: the DSO from $PREBUILT (ABI ${AABI:0:12})"
        else
          echo "$g: $PREBUILT/$g has no DSO for ABI ${AABI:0:12}; exporting here" >&2
        fi
      fi
      [ -f "$OUT/$g/kernel.so" ] || $MCORE kernel export cutedsl-decode-attention --selection "$RECEIPT" \
        -o "$OUT/$g/kernel.so" > "$OUT/$g/kernel.log" 2>&1
      echo "$AABI" > "$OUT/$g/abi"  # what PREBUILT=$OUT checks on another machine
      printf '{"schema_version": 1, "bindings": [{"id": "%s", "abi_sha256": "%s", "library": "./kernel.so", "function": "run"}]}\n' \
        "$ATTN" "$AABI" > "$OUT/$g/bindings.json"
      EXT[$g]="$MCORE run $OUT/attn.bundle --kernel-bindings $OUT/$g/bindings.json" ;;
  esac
done
if [ -n "${EXPORT_ONLY:-}" ]; then  # bundles and DSOs only, e.g. on a machine without a GPU for one with
  echo "built and exported in $OUT; on the GPU: PREBUILT=$OUT (the same MODEL, CONTEXT and TOKENS)"
  exit 0
fi
NGPU=${NGPU:-$([ "$DEVICE" = cpu ] && echo 1 || nvidia-smi -L | wc -l)}
t0=$SECONDS
k=0  # one warm run per arm, side by side where there are GPUs for them (each compiles its bundle once;
#   prefill compiles for any prompt length, so one context warms them all)
for arm in native "${!EXT[@]}"; do
  [ "$arm" = native-vs-native ] && continue
  cmd=$([ "$arm" = native ] && echo "$NATIVE" || echo "${EXT[$arm]}")
  CUDA_VISIBLE_DEVICES=$([ "$DEVICE" = cpu ] && echo "" || echo $((k % NGPU))) warm "$arm" "$cmd $(bench)" &
  k=$((k + 1))
  [ $((k % NGPU)) -eq 0 ] && wait
done
wait
echo "warm runs done in $((SECONDS - t0)) s"
PAIR_ARGS=(--pairs "$PAIRS"); [ "$PAIRS" = auto ] && PAIR_ARGS+=(--max-pairs "$MAX_PAIRS")
gate() {  # NAME FILE: one gate on the GPU CUDA_VISIBLE_DEVICES names, at the prompt $PROMPT
  $MCORE verify perf "${PAIR_ARGS[@]}" --warmup 0 --min-ratio 0.98 --metric "$METRIC" \
    --native "$NATIVE $(bench)" --external "${EXT[$1]} $(bench)" > "$2" 2>&1 || true
}
declare -a BUSY=()  # BUSY[gpu] = pid of the gate running there
RUNS_LIST=()
declare -A SEEN=()  # a name may come back ("native-vs-native:1 slow-copy:1 native-vs-native:1"): numbered on
for spec in $GATES; do
  g=${spec%%:*}; n=${spec#*:}; [ "$n" = "$spec" ] && n=1
  for _ in $(seq "$n"); do SEEN[$g]=$(( ${SEEN[$g]:-0} + 1 )); RUNS_LIST+=("$g:${SEEN[$g]}"); done
done
name() {  # RUN CONTEXT: the gate's file name
  echo "gate-${1%%:*}-${1#*:}$([ "$2" = - ] || echo "-ctx$2").txt"
}
t0=$SECONDS
for ctx in "${ORDER[@]}"; do  # every gate at the first context, then at the next
for run in "${RUNS_LIST[@]}"; do
  g=${run%%:*}
  PROMPT=${PROMPTS[$ctx]}
  while :; do  # the first GPU with no gate on it
    for ((k = 0; k < NGPU; k++)); do
      if [ -z "${BUSY[$k]:-}" ] || ! kill -0 "${BUSY[$k]}" 2>/dev/null; then break 2; fi
    done
    wait -n || true
  done
  CUDA_VISIBLE_DEVICES=$([ "$DEVICE" = cpu ] && echo "" || echo "$k") gate "$g" "$OUT/$(name "$run" "$ctx")" &
  BUSY[$k]=$!
  echo "started $(name "$run" "$ctx") on GPU $k ($((SECONDS - t0)) s)"
done
done
wait
echo "all gates done in $((SECONDS - t0)) s ($METRIC; ${PAIR_ARGS[*]})"
for ctx in "${ORDER[@]}"; do
for run in "${RUNS_LIST[@]}"; do
  f=$OUT/$(name "$run" "$ctx")
  echo "== $(basename "$f" .txt)"
  grep -E '^(pair [0-9]+/|check after|interval:|PROMOTE|REJECT|INCONCLUSIVE|FAIL)' "$f" || tail -n 3 "$f"
done
done
echo "== verdicts"
for ctx in "${ORDER[@]}"; do
for g in "${!SEEN[@]}"; do
  verdicts=$(for run in "${RUNS_LIST[@]}"; do [ "${run%%:*}" = "$g" ] && cat "$OUT/$(name "$run" "$ctx")"; done \
    | grep -oE '^(PROMOTE|REJECT|INCONCLUSIVE|FAIL)' | sort | uniq -c | xargs || true)
  echo "$g$([ "$ctx" = - ] || echo " at context $ctx"): $verdicts"
done
done
if [[ " $GATES " == *" identity-copy"* ]]; then  # native and slot in lockstep, bit for bit
  $MCORE verify logits "$OUT/native.bundle" "$OUT/slot.bundle" --kernel-bindings "$OUT/identity-copy/bindings.json" \
    --prompt 'x y z' --max-new-tokens 32 --device "$DEVICE" > "$OUT/logits-identity-copy.txt" 2>&1 || true
  echo "== identity-copy lockstep logits"; tail -n 4 "$OUT/logits-identity-copy.txt"
fi
