#!/usr/bin/env bash
# What the open issues still need from the GPU box, most important first; every stage logs under
# OUT and prints a short summary, so a run cut off by the device's time limit keeps what it did.
#   source .device/base/install.sh && bash bench/gpu_session.sh "$OUT" [suite,engine,gate,profile]
# suite:   the whole test suite (names of failures printed: -rfE)          ~4 min with -n 16
# engine:  bench/engine_gpu.py (roofline, compiled cold/cached, op by op, transformers peers)   ~9 min
# gate:    bench/perf_gate_gpu.sh (native vs native, identity-copy, slow-copy; 6 pairs)         ~6 min
# profile: mcore profile on the 8B-sized config, decode at 1k context (issue 14 evidence)        ~2 min
set -uo pipefail
OUT=${1:?usage: gpu_session.sh OUT [stages]}
STAGES=${2:-suite,engine,gate,profile}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MCORE_CACHE_DIR=${MCORE_CACHE_DIR:-/tmp/mcore-cache}
here=$(cd "$(dirname "$0")" && pwd)
has() { [[ ",$STAGES," == *",$1,"* ]]; }
if has suite; then
  python3 -m pytest -q -o addopts="" -n 16 -p no:cacheprovider -p no:logging -rfE --tb=line 2>&1 \
    | grep -v PytestBenchmarkWarning > "$OUT/suite.log"
  echo "== suite"; grep -E '^(FAILED|ERROR)|passed|failed' "$OUT/suite.log" | tail -n 25
fi
if has engine; then
  python3 "$here/engine_gpu.py" "$OUT/engine" --extra-capacity 4096 --peer-capacities 40960,4096 --steps 20 \
    > "$OUT/engine.log" 2>&1
  echo "== engine"; grep -v '^\[' "$OUT/engine.log" | tail -n 16
  rm -rf "$OUT"/engine/*.bundle "$OUT"/engine/mcore-cache*
fi
if has gate; then
  bash "$here/perf_gate_gpu.sh" "$OUT/gate" > "$OUT/gate.log" 2>&1
  echo "== gate"; cat "$OUT/gate.log" | tail -n 30
  rm -rf "$OUT"/gate/*.bundle
fi
if has profile; then
  mkdir -p "$OUT/profile"
  python3 -c "import sys; sys.path.insert(0, '$here'); from qwen3_8b_config import write_config_folder; \
from pathlib import Path; import shutil; from mcore.families.demo import materialize; \
d = write_config_folder(Path('$OUT/profile/cfg')); shutil.copy(materialize('qwen3-tiny') / 'tokenizer.json', d)"
  python3 -m mcore build "$OUT/profile/cfg" --weights random --precision bf16 --max-cache-length 40960 --device cuda \
    -o "$OUT/profile/q8b.bundle" > "$OUT/profile/build.log" 2>&1
  python3 -m mcore profile "$OUT/profile/q8b.bundle" --context 1024 --steps 3 --top 10 -o "$OUT/profile/decode.json" \
    > "$OUT/profile/top.txt" 2> "$OUT/profile/profile.log"
  echo "== profile"; cat "$OUT/profile/top.txt"
  rm -rf "$OUT/profile/q8b.bundle" "$OUT/profile/cfg"
fi
