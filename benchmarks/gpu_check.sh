#!/usr/bin/env bash
# The device checks, in one call on a lent GPU machine (the device tool), from the checkout root with .gpu-kit
# carried: ../shared/gpu-kit/prepare.sh's kit, its build.sh, and tok.gguf (a tiny random model holding the default
# tokenizer: python -m edgespec.models.random_gguf .gpu-kit/tok.gguf --shape tiny --vocab 49152). Builds llama.cpp for
# the GPU present (and llama-bench), writes random-weight f16 models, and on each target runs llama-bench tg128
# beside a breakdown of a token's time (benchmarks/decode_overhead.py), edgespec target-only and llama-cpp-python's
# generate; then, on the last target, where models load without being told (GPU by default), the pass costs the
# controller plans from, and edgespec bench with a draft model and with prompt lookup left to the controller.
# MODELS="shape vocab" pairs pick the targets; DRAFT="shape vocab" the draft model; VS=0 skips llama-cpp-python's
# generate, LOOP=0 the rows-only loop benchmark. Results under $OUT, in one archive.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$OUT/log.txt"; }
log "building llama.cpp"
bash .gpu-kit/build.sh llama-bench >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:/tmp/llama-gpu/llama.cpp/gguf-py
BIN=/tmp/llama-gpu/build/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
# which libraries numpy and llama_cpp bring in (a process that imported numpy first was seen to crash loading a model)
for first in numpy llama_cpp; do
  python3 -c "import $first; print('\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))" \
    >"$OUT/libs-$first.txt" 2>&1
done
model=
for spec in ${MODELS:-"1.5b 152064"}; do
  read -r shape vocab <<<"$spec"
  rm -f "$model"
  model=/tmp/random-$shape-$vocab.gguf
  log "writing $model"
  python3 -m edgespec.models.random_gguf "$model" --shape "$shape" --vocab "$vocab" --type f16 \
    --tokenizer .gpu-kit/tok.gguf >>"$OUT/log.txt" 2>&1 || exit 1
  log "llama-bench tg128"
  "$BIN/llama-bench" -m "$model" -ngl 99 -p 0 -n 128 -r 3 -o json >"$OUT/llama-bench-$shape-$vocab.json" \
    2>>"$OUT/log.txt"
  log "where a token's time goes: bare decode, edgespec's backend, its loop"
  timeout 150 python3 benchmarks/decode_overhead.py --model "$model" --gpu-layers 99 --threads 8 --tokens 128 \
    --reps 3 --json >"$OUT/decode-$shape-$vocab.json" 2>>"$OUT/log.txt"
  [ "${VS:-1}" = 1 ] || continue
  log "edgespec target-only and llama-cpp-python generate, interleaved"
  timeout 240 python3 benchmarks/vs_llama_cpp_python.py --model "$model" --gpu-layers 99 --threads 8 --flash-attn off \
    --prompts 4 --max-tokens 128 --reps 2 --json >"$OUT/vs-$shape-$vocab.json" 2>>"$OUT/log.txt"
done
read -r dshape dvocab <<<"${DRAFT:-135m 152064}"
draft=/tmp/random-draft-$dshape-$dvocab.gguf
log "writing the draft $draft"
python3 -m edgespec.models.random_gguf "$draft" --shape "$dshape" --vocab "$dvocab" --type f16 \
  --tokenizer .gpu-kit/tok.gguf >>"$OUT/log.txt" 2>&1 || exit 1
# the CLI, llama_cpp imported before numpy (that image crashed loading a model the other way round)
printf '%s\n' 'import llama_cpp, sys' 'from edgespec.cli import main' 'sys.exit(main())' >/tmp/edgespec-cli.py
log "GPU by default: generate without --device, --gpu-layers or --cpu"
timeout 120 python3 /tmp/edgespec-cli.py generate "Write a short story about a robot." -m "$model" --draft none -n 32 --json \
  >"$OUT/generate-default.json" 2>>"$OUT/log.txt"
log "pass costs the controller plans from (1..16 tokens), target and draft on the GPU"
timeout 120 python3 - "$model" "$draft" >"$OUT/pass-costs.json" 2>>"$OUT/log.txt" <<'PY'
import llama_cpp  # noqa: F401 (before numpy)
import json, sys
from edgespec.decode.cost import measure_pass_costs
from edgespec.backends.llama.backend import LlamaBackend
out = {}
for role, path in (("target", sys.argv[1]), ("draft", sys.argv[2])):
    b = LlamaBackend(path, n_ctx=512, n_threads=8, n_gpu_layers=99)
    out[role] = {"model": path, "seconds": measure_pass_costs(b, 16, reps=5)}
    b.close()
print(json.dumps(out, indent=1))
PY
printf '%s\n' '{"cat": "story", "prompt": "Write a short story about a lighthouse keeper."}' \
  '{"cat": "code", "prompt": "Write a Python function that merges two sorted lists."}' \
  '{"cat": "facts", "prompt": "Explain how vaccines train the immune system."}' \
  '{"cat": "rewrite", "prompt": "Rewrite this more formally: hey, the meeting moved to 3pm, see you there."}' \
  >/tmp/gpu-prompts.jsonl
for d in "$draft" ngram; do
  name=$([ "$d" = ngram ] && echo ngram || echo model)
  log "edgespec bench, draft $name left to the controller (random weights: acceptance near 0)"
  timeout 240 python3 /tmp/edgespec-cli.py bench -m "$model" --draft "$d" --prompts /tmp/gpu-prompts.jsonl -n 96 --json \
    >"$OUT/bench-$name.json" 2>>"$OUT/log.txt"
done
log "each round of prompt lookup left to the controller"
timeout 120 python3 experiments/controller_trace.py --target "$model" --draft ngram --json \
  --prompt "Explain how vaccines train the immune system." --prompt "Write a short story about a lighthouse keeper." \
  >"$OUT/trace-ngram.json" 2>>"$OUT/log.txt"
rm -f "$model" "$draft"
if [ "${LOOP:-1}" = 1 ]; then
  log "the loop over rows only, on this machine's CPU"
  timeout 150 python3 benchmarks/loop_overhead.py --rows flat --vocab 152064 --tokens 300 --json \
    >"$OUT/loop-flat.json" 2>>"$OUT/log.txt"
fi
log "done"
# one file back: the device tool returns a few files per call
(cd "$OUT" && tar czf /tmp/gpu-check.tgz --exclude=build.txt . && rm -f ./*.json ./*.txt && mv /tmp/gpu-check.tgz .)
