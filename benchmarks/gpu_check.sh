#!/usr/bin/env bash
# The device checks of the loop at device speed, in one call on a lent GPU machine (the device tool), from the
# checkout root with .gpu-kit carried: ../shared/gpu-kit/prepare.sh's kit, its build.sh, and tok.gguf (a tiny
# random model holding the default tokenizer: python -m edgespec.models.random_gguf .gpu-kit/tok.gguf --shape tiny
# --vocab 49152). Builds llama.cpp for the GPU present (and llama-bench), writes random-weight f16 models, and runs
# llama-bench tg128 beside a breakdown of a token's time (benchmarks/decode_overhead.py), edgespec target-only and
# llama-cpp-python's generate on each. MODELS="shape vocab" pairs pick the models, LOOP=0 skips the rows-only loop
# benchmark. Results under $OUT.
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
for spec in ${MODELS:-"3b 49152" "1.5b 152064"}; do
  read -r shape vocab <<<"$spec"
  model=/tmp/random-$shape-$vocab.gguf
  log "writing $model"
  python3 -m edgespec.models.random_gguf "$model" --shape "$shape" --vocab "$vocab" --type f16 \
    --tokenizer .gpu-kit/tok.gguf >>"$OUT/log.txt" 2>&1 || exit 1
  log "llama-bench tg128"
  "$BIN/llama-bench" -m "$model" -ngl 99 -p 0 -n 128 -r 3 -o json >"$OUT/llama-bench-$shape-$vocab.json" \
    2>>"$OUT/log.txt"
  log "where a token's time goes: bare decode, edgespec's backend, its loop"
  timeout 120 python3 benchmarks/decode_overhead.py --model "$model" --gpu-layers 99 --threads 8 --tokens 128 \
    --reps 3 --json >"$OUT/decode-$shape-$vocab.json" 2>>"$OUT/log.txt"
  log "edgespec target-only and llama-cpp-python generate, interleaved"
  timeout 240 python3 benchmarks/vs_llama_cpp_python.py --model "$model" --gpu-layers 99 --threads 8 --flash-attn off \
    --prompts 4 --max-tokens 128 --reps 2 --json >"$OUT/vs-$shape-$vocab.json" 2>>"$OUT/log.txt"
  log "the same with edgespec's cache holding one sequence"
  timeout 240 python3 benchmarks/vs_llama_cpp_python.py --model "$model" --gpu-layers 99 --threads 8 --flash-attn off \
    --prompts 4 --max-tokens 128 --reps 2 --sequences 1 --json >"$OUT/vs1-$shape-$vocab.json" 2>>"$OUT/log.txt"
  rm -f "$model"
done
[ "${LOOP:-1}" = 1 ] || { log "done"; exit 0; }
log "the loop over rows only, on this machine's CPU"
timeout 150 python3 benchmarks/loop_overhead.py --rows flat --vocab 152064 --tokens 300 --json \
  >"$OUT/loop-flat.json" 2>>"$OUT/log.txt"
log "done"
