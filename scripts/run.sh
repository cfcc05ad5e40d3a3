#!/usr/bin/env bash
# The main job: set up, build, and run Trellis on a model.
#   MODEL=path/to/model.gguf scripts/run.sh     # your model
#   scripts/run.sh                              # embedded default (see below)
# With no MODEL, a random-weight model with TinyLlama-1.1B's exact architecture and the
# LLaMA SentencePiece vocab (shipped in tests/data/vocab) is generated once, in Q4_0 as
# llama-quantize makes it, and cached in ${TRELLIS_CACHE:-~/.cache/trellis}. Random
# weights cost exactly what trained ones cost, so the speed figures are real; the text
# is gibberish.
# Then: a short generation (text streamed, speed printed) and the speed benchmark
# (pp512 / tg64, 2 threads, median of 5), printed as a table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release trellis >&2
THREADS=${THREADS:-2}
if [[ -z "${MODEL:-}" ]]; then
  cache=${TRELLIS_CACHE:-$HOME/.cache/trellis}
  mkdir -p "$cache"
  MODEL="$cache/tinyllama-shape-q4_0.gguf"
  if [[ ! -s "$MODEL" ]]; then
    echo "run: generating the default model (TinyLlama-1.1B shape, Q4_0, random weights) -> $MODEL" >&2
    build/trellis gen-model --shape tinyllama --type q4_0 -o "$MODEL" --threads "$THREADS"
  fi
fi
echo "== trellis run ($MODEL)" >&2
build/trellis run -m "$MODEL" -p "${PROMPT:-Once upon a time, in a village by the sea,}" -n 32 \
  --threads "$THREADS" --seed 1
echo "== trellis bench speed" >&2
mkdir -p results
build/trellis bench speed -m "$MODEL" --threads "$THREADS" -p 512 -n 64 -r 5 --csv results/speed.csv
