#!/usr/bin/env bash
# What the open issues still need from the GPU box, most important first; every stage works under
# /tmp/gpu-session, prints a short summary and leaves one log file per stage in OUT (the device
# returns at most 8 files), so a run cut off by the device's time limit keeps what it did.
#   source .device/base/install.sh && bash bench/gpu_session.sh "$OUT" [suite,engine,gate,profile]
# suite:   the whole test suite (names of failures printed: -rfE); more than one call's 10 minutes now;
#          the CuTe DSL must be carried (prepare.sh --cute): the test extra requires it, so its tests fail without it
#          suite-gpu (GPU-marked tests and shipped-session replays, then the timing tests alone) + suite-rest (the
#          others) split it; suite-gpu = suite-gpu-share + suite-timing, for a call that runs the share beside another
#          stage and the timing tests after both (N=16 pytest workers; N=12 leaves cores to a stage beside)
# walk:    the README's GPU walk, DEVICE=cuda PRECISION=bf16 bash bench/tutorial_cli.sh (every step; step 4's perf
#          gate on the device metric, WALK_MAX_PAIRS=3 pairs at most; needs the CuTe DSL for step 5)      ~5 min
# engine:  bench/engine_gpu.py (roofline, compiled cold/cached, op by op, transformers peers)   ~9 min
#          issue 32 (start-up as whole processes, the whole-graph compile beside, prefill share), ~6 min:
#          ENGINE_ARGS="--parts roofline,startup,compiled,reference,prefill --contexts 1024,32768 --steps 20 --extra-capacity="
# gate:    bench/perf_gate_gpu.sh (native vs native, identity-copy, slow-copy; --pairs auto, at most 4)
#          each run is a fresh process (about 26 s on the H200); gates run side by side, one per GPU
# profile: bench/profile_gpu.py, the compiled 8B-sized decode step at 1k/32k, native vs CuTe attention ~6 min
# attention: tutorial step 5 on the GPU (bench/tutorial_cli.sh, all steps) and the qwen-attention
#          session replayed with its CUDA steps (needs the CuTe DSL carried: prepare.sh --cute)    ~8 min
# attnbench: bench/attention_gpu.py, the CuTe attention kernel against native on the 8B-sized config
#          (kernel per call, whole step with all 36 layers bound; needs the CuTe DSL; ATTN_ARGS)    ~6 min
# ropeprof: the compiled 8B-sized decode step profiled at 1k and 32k (ROPE_CONTEXTS) with MCORE_ATTN_ROPE=1 and =0,
#          each a process of its own, the reports kept: where the rotary prologue's 0.14 ms at 32k goes  ~6 min
# gemv:    bench/gemv_gpu.py --sweep, mcore::gemv against cuBLAS at the 8B decode shapes (issue 8)  ~3 min
# fusions: issue 32's launch cuts (MCORE_GEMV_NORM=1 opt-in, MCORE_ATTN_ROPE on by default): their GPU tests, then the
#          8B-sized decode step with MCORE_GEMV_NORM=0 and =1 in alternation, twice each, in processes of their own
#          (logits compared; FUSION_VARIANTS for others)  ~4 min on an H100
set -uo pipefail
OUT=${1:?usage: gpu_session.sh OUT [stages]}
STAGES=${2:-suite,engine,gate,profile,attention}
ENGINE_ARGS=${ENGINE_ARGS:---extra-capacity 4096 --peer-capacities 40960,4096 --steps 20}
W=/tmp/gpu-session
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1 MCORE_CACHE_DIR=${MCORE_CACHE_DIR:-/tmp/mcore-cache}
# The device image's site-packages keep no bytecode: every process compiled torch's and sympy's
# sources again (7.4 s of a 15.4 s profiled reload, 2026-12-01). A pip install writes bytecode at
# install time; caching it here from the first process on times loads as a user's machine runs them.
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
unset PYTHONDONTWRITEBYTECODE
here=$(cd "$(dirname "$0")" && pwd)
has() { [[ ",$STAGES," == *",$1,"* ]]; }
keep() {  # STAGE: the stage's logs (no bundles, no DSOs) as one file in OUT
  (cd "$W" && find "$1" -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' \) -size -8M -print0 \
    | tar czf "$OUT/$1.tgz" --null -T -)
}
suite() {  # NAME PYTEST_ARGS...: one share of the suite, its log in OUT
  # -v straight into the file (no filter in between): a run cut short by a time limit still names
  # every test that finished, FAILED ones included (a filtered pipe lost a whole run's log once)
  local name=$1 report=()
  shift
  # a failed TUI snapshot is read from its report (expected beside actual), which only comes back from OUT
  python3 -c "import pytest_textual_snapshot" 2>/dev/null && report=(--snapshot-report "$OUT/$name-snapshots.html")
  python3 -m pytest -v -o addopts="" -p no:cacheprovider -p no:logging -rfE --tb=short --durations=10 "${report[@]}" "$@" \
    > "$OUT/$name.log" 2>&1
  # failures as -v and -rfE name them, and pytest's closing line (test ids may read "1/1 passed" too)
  echo "== $name"; grep -E '\] (FAILED|ERROR) tests/|^(FAILED|ERROR) |^=+ .*[0-9]+ (passed|failed|error)' "$OUT/$name.log" | tail -n 25
}
# the whole suite in one stage (about 15 min on the H200 with the defaults of 2026-12-01: more than
# one call), or in two shares that each fit a call: suite-gpu (the GPU-marked tests and the shipped
# sessions' replays, which compile on CUDA and take minutes each) and suite-rest (everything else)
# tests marked `timing` time the GPU: under -n 16 they share it with other tests' compiles and
# kernels (a 5% repeatability check failed that way once), so they run alone after each share
N=${N:-16}
if has suite; then suite suite -n "$N" -m "not timing" tests/; suite suite-timing -m timing tests/; fi
if has suite-gpu || has suite-gpu-share; then suite suite-gpu -n "$N" -m "(gpu or slow) and not timing" tests/; fi
if has suite-gpu || has suite-timing; then suite suite-timing -m timing tests/; fi
has suite-rest && suite suite-rest -n "$N" -m "not gpu and not slow" tests/
if has walk; then
  # the GPU walk (issue 26, item 4): a stage of its own, so that it can run beside a CPU-bound one
  mkdir -p "$W/walk"
  MCORE="python3 -m mcore" DEVICE=cuda PRECISION=bf16 MAX_PAIRS=${WALK_MAX_PAIRS:-3} bash "$here/tutorial_cli.sh" "$W/walk/cli" \
    > "$OUT/walk.log" 2>&1
  echo "== walk (exit $?)"; tail -n 6 "$OUT/walk.log"
  rm -rf "$W"/walk/cli/*.bundle
fi
if has engine; then
  # shellcheck disable=SC2086
  python3 "$here/engine_gpu.py" "$W/engine" $ENGINE_ARGS > "$OUT/engine.log" 2>&1
  echo "== engine"; grep -v '^\[' "$OUT/engine.log" | tail -n 40
  rm -rf "$W"/engine/*.bundle "$W"/engine/mcore-cache* "$W"/engine/*-cache* "$W"/engine/cfg-*
  keep engine  # the parts' logs (each mcore run's progress stamps, the load stamps)
fi
if has gate; then
  mkdir -p "$W/gate"
  bash "$here/perf_gate_gpu.sh" "$W/gate" > "$W/gate/gate.log" 2>&1
  echo "== gate"; tail -n 30 "$W/gate/gate.log"
  keep gate
fi
if has profile; then
  # the compiled engine's profile of the 8B-sized decode step at 1k and 32k, native and with the CuTe
  # attention in all 36 layers (needs the CuTe DSL carried for that half), and their diff (issue 26)
  P=$W/profile
  mkdir -p "$P"
  python3 "$here/profile_gpu.py" "$P" --archive "$OUT/profile.tgz" > "$OUT/profile.log" 2>&1
  echo "== profile"; grep -Ev '^\[ *[0-9]+%\]|^W[0-9]|USDT|^ +mcore (build|graph select)' "$OUT/profile.log" | tail -n 160
  rm -rf "$P"
fi
if has attention; then
  A=$W/attention
  mkdir -p "$A"
  MCORE="python3 -m mcore" DEVICE=cuda PRECISION=bf16 PAIRS=2 bash "$here/tutorial_cli.sh" "$A/cli" > "$A/cli.log" 2>&1
  python3 -m workbench replay "$here/../sessions/qwen-attention.json" --headless --workdir "$A/replay" \
    --trust-libraries . > "$A/replay.log" 2>&1
  echo "== attention"; tail -n 6 "$A/cli.log"; tail -n 12 "$A/replay.log"
  rm -rf "$A"/cli/*.bundle "$A"/replay/*.bundle
  keep attention
fi
if has attnbench; then
  # ATTN_ARGS: the bench's options, e.g. "--bind 1,3,4 --no-flashinfer" (several variants' whole steps in turn)
  python3 "$here/attention_gpu.py" "$W/attnbench" ${ATTN_ARGS:-} > "$OUT/attnbench.log" 2>&1
  cp "$W/attnbench/attention.json" "$OUT/attnbench.json" 2>/dev/null
  echo "== attnbench"; grep -v '^\[' "$OUT/attnbench.log" | tail -n 60
  rm -rf "$W"/attnbench/*.bundle
fi
if has fusions; then
  python3 -m pytest -q -o addopts="" -p no:cacheprovider -n 8 -m "gpu and not timing" tests/test_gemv.py \
    tests/test_flash_decode.py tests/test_rope_attention.py > "$OUT/fusions-tests.log" 2>&1
  echo "== fusions: gpu tests"; grep -E "passed|failed|FAILED|ERROR|^E " "$OUT/fusions-tests.log" | tail -n 12
  # the norm cut beside today's defaults (the rotary prologue on, at 4 stages), each twice in alternation:
  # 219 kernels against 255; last timed in the nineteenth session, before the prologue (5.83 vs 5.76 ms at 1k)
  base="MCORE_GEMV_NORM=0"
  norm="MCORE_GEMV_NORM=1"
  python3 "$here/engine_gpu.py" "$W/fusions" --parts roofline --contexts 1024,32768 --steps 30 --extra-capacity= \
    --variants "${FUSION_VARIANTS:-$base;$norm;$base;$norm}" > "$OUT/fusions.log" 2>&1
  echo "== fusions: engine"; grep -v '^\[' "$OUT/fusions.log" | grep -v "^  .* load: " | tail -n 45
  rm -rf "$W"/fusions/*.bundle "$W"/fusions/*-cache*
fi
if has ropeprof; then
  for r in 1 0; do
    MCORE_GEMV_NORM=0 MCORE_ATTN_ROPE=$r python3 "$here/profile_gpu.py" "$W/ropeprof$r" --parts native \
      --contexts "${ROPE_CONTEXTS:-1024,32768}" --steps 5 --top 16 > "$OUT/ropeprof$r.log" 2>&1
    echo "== ropeprof MCORE_ATTN_ROPE=$r"; grep -Ev '^\[|^W[0-9]|USDT' "$OUT/ropeprof$r.log" | tail -n 40
    # every kernel's time is in the reports, not in the top lines: keep them to compare the contexts
    mkdir -p "$OUT/ropeprof$r" && cp "$W/ropeprof$r"/*.json "$OUT/ropeprof$r/" 2>/dev/null
    rm -rf "$W/ropeprof$r"
  done
fi
if has gemv; then
  python3 "$here/gemv_gpu.py" --sweep --json "$OUT/gemv.json" > "$OUT/gemv.log" 2>&1
  echo "== gemv"; tail -n 40 "$OUT/gemv.log"
fi
