#!/usr/bin/env bash
# The runs behind docs/results.md: every single-shot method of issue C on NQ-open (oracle file) and HotpotQA over
# the pooled corpus, with SmolLM2-135M and Qwen2.5-Coder-1.5B on llama.cpp. Every run resumes: rerun this script
# after a kill (or with a larger LIMIT) and only the missing answers are computed.
#   INDEX=~/.cache/ragate/indexes/pooled-dense LIMIT=30 MODELS="smollm2-135m" bash scripts/results.sh
set -euo pipefail
INDEX=${INDEX:-$HOME/.cache/ragate/indexes/pooled-dense}
LIMIT=${LIMIT:-30}
MODELS=${MODELS:-"smollm2-135m qwen2.5-coder-1.5b"}
DATASETS=${DATASETS:-"nq-open-oracle hotpotqa"}
RAGATE=${RAGATE:-.venv/bin/ragate}
METHODS=no-retrieval,standard-rag,llm-judge,hyde,q2d,cot,dtr,dtr-no-ugt,dpr-ais,dpr-ais-dynamic,dpr-ais-rerank,pairs,pairs-exclude-num,targ-entropy,targ-margin,targ-variance,random
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "no index at $INDEX: ragate corpus build && ragate index build --corpus ~/.cache/ragate/corpora/pooled/passages.jsonl --kind dense --out $INDEX" >&2
  exit 2
fi
for model in $MODELS; do
  for dataset in $DATASETS; do
    out=docs/results/runs/$dataset-$model-$LIMIT
    resume=(); [ -f "$out/config.json" ] && resume=(--resume)
    "$RAGATE" eval --dataset "$dataset" --methods "$METHODS" --index "$INDEX" --model "$model" \
      --limit "$LIMIT" --out "$out" "${resume[@]}"
    "$RAGATE" report "$out" --metric acc
  done
done
