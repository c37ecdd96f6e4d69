#!/usr/bin/env bash
# The device checks, in one call on a lent GPU machine (the device tool), from the checkout root with .gpu-kit
# carried: ../shared/gpu-kit/prepare.sh's kit, its build.sh, and tok.gguf (a tiny random model holding the default
# tokenizer: python -m edgespec.models.random_gguf .gpu-kit/tok.gguf --shape tiny --vocab 49152). Builds llama.cpp for
# the GPU present (and llama-bench), writes random-weight f16 models, and on each target runs llama-bench tg128
# beside a breakdown of a token's time (benchmarks/decode_overhead.py), edgespec target-only and llama-cpp-python's
# generate; then, on the last target, where models load without being told (GPU by default), the pass costs the
# controller plans from, and edgespec bench with a draft model and with prompt lookup left to the controller.
# MODELS="shape vocab,..." picks the targets; DRAFT="shape vocab" the draft model; VS=0 skips llama-cpp-python's
# generate, LOOP=0 the rows-only loop benchmark, BENCH=0 edgespec bench with each draft, DECLINED=0 the declined
# draft's cost, TRACE=0 the controller's trace, DECODE=0 the breakdown of a token's time, BASICS=0 the default-placement generate and the pass costs,
# STREAMS=0 several requests at once (1 vs 4 streams on one context, experiments/streams_throughput.py; 4 streams
# drafting fixed lengths, experiments/streams_draft.py: what joined draft steps cost there), SERVE=1 (off by
# default: it builds llama-server too) issue 45's criterion, edgespec serve --parallel N against llama-server -np N at
# 1 and 4 clients (benchmarks/serve_load.py: plain and prompt lookup, the random target), and conversations of 3
# turns from 8 clients on 4 slots with and without the prompt cache. Steps that would run past DEADLINE seconds from
# the start (default 520) are skipped, so the archive comes back inside one device call. Also: whether a process that
# imports numpy before llama_cpp loads a model (numpy-first.txt), and what a declined draft model and prompt lookup
# cost beside target-only on the GPU (experiments/declined_draft.py, t=0 and t=1, with the host's time between
# passes). Results under $OUT, in one archive.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$OUT/log.txt"; }
# step CAP FILE NAME CMD...: runs CMD, stdout to FILE, for at most CAP seconds and never past the deadline
step() {
  local cap=$1 file=$2 name=$3 left
  shift 3
  left=$((${DEADLINE:-520} - ($(date +%s) - start)))
  if [ "$left" -lt 20 ]; then log "skipped (deadline): $name"; return 1; fi
  [ "$cap" -lt "$left" ] || cap=$left
  log "$name"
  timeout "$cap" "$@" >"$file" 2>>"$OUT/log.txt" || log "exit status $? (cap ${cap} s): $name"
}
log "building llama.cpp"
bash .gpu-kit/build.sh llama-bench $([ "${SERVE:-0}" = 1 ] && echo llama-server) >"$OUT/build.txt" 2>&1 \
  || { tail -30 "$OUT/build.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:/tmp/llama-gpu/llama.cpp/gguf-py
BIN=/tmp/llama-gpu/build/bin
# edgespec's C row passes (decode/_rows.c) for this Python: compiled modules are not carried (git ignores them), and
# without them every law is made by numpy's passes, as in the device checks of 2026-11-26 and -27 (t=0.7, a 152k row:
# 196 us a token on a 2-core EPYC against the C passes' 106, benchmarks/loop_overhead.py --passes numpy|built)
log "edgespec's C row passes, built for this Python"
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
python3 setup.py -q build_ext --inplace >>"$OUT/log.txt" 2>&1 || gcc -O3 -shared -fPIC "-I$include" \
  edgespec/decode/_rows.c edgespec/decode/_weights.c -lm -o "edgespec/decode/_rows$suffix" >>"$OUT/log.txt" 2>&1
python3 -c "from edgespec.decode import rows; print(rows.kind())" >"$OUT/rows-kind.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
# which libraries numpy and llama_cpp bring in (a process that imported numpy first was seen to crash loading a model)
for first in numpy llama_cpp; do
  python3 -c "import $first; print('\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))" \
    >"$OUT/libs-$first.txt" 2>&1
done
read -r dshape dvocab <<<"${DRAFT:-135m 152064}"
draft=/tmp/random-draft-$dshape-$dvocab.gguf
log "writing the draft $draft"
python3 -m edgespec.models.random_gguf "$draft" --shape "$dshape" --vocab "$dvocab" --type f16 \
  --tokenizer .gpu-kit/tok.gguf >>"$OUT/log.txt" 2>&1 || exit 1
log "numpy imported before llama_cpp, then a model loaded (and the other order)"
for first in "numpy, llama_cpp" "llama_cpp, numpy"; do
  timeout 60 python3 -c "import $first; llama_cpp.Llama('$draft', n_gpu_layers=99, verbose=False); print('loaded')" \
    >>"$OUT/numpy-first.txt" 2>&1
  echo "import $first: exit status $?" >>"$OUT/numpy-first.txt"
done
model=
IFS=, read -ra specs <<<"${MODELS:-1.5b 152064}"  # MODELS="8b 49152,3b 152064"
for spec in "${specs[@]}"; do
  read -r shape vocab <<<"$spec"
  rm -f "$model"
  model=/tmp/random-$shape-$vocab.gguf
  log "writing $model"
  python3 -m edgespec.models.random_gguf "$model" --shape "$shape" --vocab "$vocab" --type f16 \
    --tokenizer .gpu-kit/tok.gguf >>"$OUT/log.txt" 2>&1 || exit 1
  step 60 "$OUT/llama-bench-$shape-$vocab.json" "llama-bench tg128" \
    "$BIN/llama-bench" -m "$model" -ngl 99 -p 0 -n 128 -r 3 -o json
  [ "${DECODE:-1}" = 1 ] && step 150 "$OUT/decode-$shape-$vocab.json" \
    "where a token's time goes: bare decode, edgespec's backend, its loop" \
    python3 benchmarks/decode_overhead.py --model "$model" --gpu-layers 99 --threads 8 --tokens 128 --reps 3 --json
  [ "${VS:-1}" = 1 ] || continue
  step 240 "$OUT/vs-$shape-$vocab.json" "edgespec target-only and llama-cpp-python generate, interleaved" \
    python3 benchmarks/vs_llama_cpp_python.py --model "$model" --gpu-layers 99 --threads 8 --flash-attn off \
    --prompts 4 --max-tokens 128 --reps 2 --json
done
# the CLI and scripts, llama_cpp imported before numpy (that image crashed loading a model the other way round)
printf '%s\n' 'import llama_cpp, sys' 'from edgespec.cli import main' 'sys.exit(main())' >/tmp/edgespec-cli.py
printf '%s\n' 'import llama_cpp, runpy, sys' 'sys.argv = sys.argv[1:]' 'runpy.run_path(sys.argv[0], run_name="__main__")' \
  >/tmp/llama-first.py
for t in $([ "${DECLINED:-1}" = 1 ] && echo 0 1); do
  step 100 "$OUT/declined-t$t.txt" "a declined draft model and prompt lookup beside target-only, t=$t" \
    python3 /tmp/llama-first.py experiments/declined_draft.py --target "$model" --draft "$draft" -t $t \
    --gpu-layers 99 --threads 8 --reps 3 --raw 100
done
[ "${BASICS:-1}" = 1 ] && step 60 "$OUT/generate-default.json" \
  "GPU by default: generate without --device, --gpu-layers or --cpu" \
  python3 /tmp/edgespec-cli.py generate "Write a short story about a robot." -m "$model" --draft none -n 32 --json
cat >/tmp/pass-costs.py <<'PY'
import llama_cpp  # noqa: F401 (before numpy)
import json, sys
from edgespec.decode.calibrate import measure_pass_costs
from edgespec.backends.llama.backend import LlamaBackend
out = {}
for role, path in (("target", sys.argv[1]), ("draft", sys.argv[2])):
    b = LlamaBackend(path, n_ctx=512, n_threads=8, n_gpu_layers=99)
    out[role] = {"model": path, "seconds": measure_pass_costs(b, 16, reps=5)}
    b.close()
print(json.dumps(out, indent=1))
PY
[ "${BASICS:-1}" = 1 ] && step 60 "$OUT/pass-costs.json" \
  "pass costs the controller plans from (1..16 tokens), target and draft on the GPU" \
  python3 /tmp/pass-costs.py "$model" "$draft"
printf '%s\n' '{"cat": "story", "prompt": "Write a short story about a lighthouse keeper."}' \
  '{"cat": "code", "prompt": "Write a Python function that merges two sorted lists."}' \
  '{"cat": "facts", "prompt": "Explain how vaccines train the immune system."}' \
  '{"cat": "rewrite", "prompt": "Rewrite this more formally: hey, the meeting moved to 3pm, see you there."}' \
  >/tmp/gpu-prompts.jsonl
for d in $([ "${BENCH:-1}" = 1 ] && echo ngram "$draft"); do
  name=$([ "$d" = ngram ] && echo ngram || echo model)
  step 120 "$OUT/bench-$name.json" "edgespec bench, draft $name left to the controller (random weights: acceptance near 0)" \
    python3 /tmp/edgespec-cli.py bench -m "$model" --draft "$d" --prompts /tmp/gpu-prompts.jsonl -n 96 --json
done
if [ "${TRACE:-1}" = 1 ]; then
  step 90 "$OUT/trace-ngram.json" "each round of prompt lookup left to the controller" \
    python3 /tmp/llama-first.py experiments/controller_trace.py --target "$model" --draft ngram --json \
    --prompt "Explain how vaccines train the immune system." --prompt "Write a short story about a lighthouse keeper."
fi
if [ "${STREAMS:-1}" = 1 ]; then  # issue 45: several requests on one context, where a pass of 4 x 5 rows is cheap
  step 150 "$OUT/streams.json" "8 requests one at a time and 4 at a time (none, prompt lookup, the draft model)" \
    python3 /tmp/llama-first.py experiments/streams_throughput.py --target "$model" --draft "$draft" --prompts 8 \
    --max-tokens 64 --streams 4 --reps 2 --threads 8 --json
  step 120 "$OUT/streams-draft.json" "4 streams drafting fixed lengths with the draft model, steps joined (costs)" \
    python3 /tmp/llama-first.py experiments/streams_draft.py --target "$model" --draft "$draft" --prompts 8 \
    --max-tokens 64 --threads 8 --json
fi
if [ "${SERVE:-0}" = 1 ]; then  # issue 45: servers under 1 and 4 clients; every python imports llama_cpp first
  # edgespec serve's web stack, which that image lacks (fastapi, uvicorn and what they need, opentelemetry-api
  # included), for its CPython 3.12, put in the kit here: pip download --only-binary=:all: --python-version 3.12
  # --platform manylinux2014_x86_64 --implementation cp -d .gpu-kit/serve-wheels fastapi==V uvicorn==V (this venv's)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-kit/serve-wheels/*.whl >>"$OUT/log.txt" 2>&1 \
    || log "no web stack from .gpu-kit/serve-wheels (download it as above): edgespec serve will not start"
  mkdir -p /tmp/llama-first-site && echo 'import llama_cpp  # noqa: F401 (before numpy)' \
    >/tmp/llama-first-site/sitecustomize.py
  step 300 "$OUT/serve-load.txt" "edgespec serve --parallel N against llama-server -np N, 1 and 4 clients" \
    env PYTHONPATH="/tmp/llama-first-site:$PYTHONPATH" python3 -u benchmarks/serve_load.py --target "$model" \
    --clients 1 4 --per-client 4 --max-tokens 64 --threads 8 --ctx 1024 --gpu-layers 99 --llama-bin "$BIN" \
    --systems llama llama+ngram edgespec edgespec+ngram --json "$OUT/serve-load.json"
  step 200 "$OUT/serve-turns.txt" "conversations of 3 turns, 8 clients on 4 slots (prompt cache)" \
    env PYTHONPATH="/tmp/llama-first-site:$PYTHONPATH" python3 -u benchmarks/serve_load.py --target "$model" \
    --clients 8 --slots 4 --per-client 3 --turns 3 --max-tokens 64 --threads 8 --ctx 1536 --gpu-layers 99 \
    --prompts benchmarks/prompts/long-notes.jsonl --llama-bin "$BIN" --systems llama edgespec edgespec-cache \
    --json "$OUT/serve-turns.json"
fi
rm -f "$model" "$draft"
if [ "${LOOP:-1}" = 1 ]; then
  step 150 "$OUT/loop-flat.json" "the loop over rows only, on this machine's CPU" \
    python3 benchmarks/loop_overhead.py --rows flat --vocab 152064 --tokens 300 --json
fi
log "done"
# one file back: the device tool returns a few files per call
(cd "$OUT" && tar czf /tmp/gpu-check.tgz --exclude=build.txt . && rm -f ./*.json ./*.txt && mv /tmp/gpu-check.tgz .)
