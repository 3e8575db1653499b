#!/usr/bin/env bash
# The runs behind docs/results.md: every single-shot method of issue C on NQ-open (oracle file) and HotpotQA over
# the pooled corpus, then the gate sweep on the same questions (it reuses the eval's LM calls from the shared call
# store, RAGATE_HOME/calls.sqlite). Both cores: WORKERS processes, each pinned to its own core. Every run
# resumes: rerun this script after a kill (or with a larger LIMIT) and only the missing answers are computed.
#   INDEX=~/.cache/ragate/indexes/pooled-dense LIMIT=300 MODELS="qwen2.5-coder-1.5b" bash scripts/results.sh
set -euo pipefail
INDEX=${INDEX:-$HOME/.cache/ragate/indexes/pooled-dense}
LIMIT=${LIMIT:-300}
MODELS=${MODELS:-"qwen2.5-coder-1.5b"}
DATASETS=${DATASETS:-"nq-open-oracle hotpotqa"}
WORKERS=${WORKERS:-2}
SWEEP=${SWEEP:-1}
RAGATE=${RAGATE:-.venv/bin/ragate}
METHODS=no-retrieval,standard-rag,llm-judge,hyde,q2d,cot,dtr,dtr-no-ugt,dpr-ais,dpr-ais-dynamic,dpr-ais-rerank,pairs,pairs-exclude-num,targ-entropy,targ-margin,targ-variance,random
GATES=dtr,llm-judge,random,targ-entropy,targ-margin,targ-variance
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "no index at $INDEX: ragate corpus build && ragate index build --corpus ~/.cache/ragate/corpora/pooled/passages.jsonl --kind dense --out $INDEX" >&2
  exit 2
fi
for model in $MODELS; do
  for dataset in $DATASETS; do
    out=docs/results/runs/$dataset-$model-$LIMIT
    resume=(); [ -f "$out/config.json" ] && resume=(--resume)
    "$RAGATE" eval --dataset "$dataset" --methods "$METHODS" --index "$INDEX" --model "$model" \
      --limit "$LIMIT" --out "$out" --workers "$WORKERS" "${resume[@]}"
    "$RAGATE" report "$out" --metric acc
    if [ "$SWEEP" = 1 ]; then
      out=docs/results/runs/sweep-$dataset-$model-$LIMIT
      resume=(); [ -f "$out/config.json" ] && resume=(--resume)
      "$RAGATE" sweep --dataset "$dataset" --methods "$GATES" --index "$INDEX" --model "$model" \
        --limit "$LIMIT" --out "$out" --workers "$WORKERS" "${resume[@]}"
      "$RAGATE" report "$out" --metric acc
    fi
  done
done
