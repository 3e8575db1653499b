#!/usr/bin/env bash
# The runs behind docs/results.md: the gate sweep and every single-shot method of issue C on NQ-open (oracle file)
# and HotpotQA over the pooled corpus. Both cores: WORKERS processes, each pinned to its own core. Every run
# resumes: rerun this script after a kill (or with a larger LIMIT) and only the missing answers are computed.
#   INDEX=~/.cache/ragate/indexes/pooled-dense LIMIT=300 MODELS="qwen2.5-coder-1.5b" bash scripts/results.sh
# With SWEEP=1 (default) the sweep runs first and the eval computes only the methods it has not answered: the
# sweep's gates at their default thresholds and the methods that never or always retrieve with a swept family's
# prompts (no-retrieval, standard-rag, dtr-no-ugt) are the same calls, and `ragate report --sweep` takes them
# from it (ragate.eval.sweep.default_records). no-retrieval stays in the eval: it is Δlatency's baseline and costs
# ~50 prompt tokens a question. SWEEP=0 evaluates all 17 methods directly.
# DYNAMIC=1 (default) then runs the dynamic methods (docs/dynamic.md) on LIMIT HotpotQA questions. Its 300-question
# directory began as the 100-question benchmark run of 2026-11-23 (benchmarks/results/dynamic-hotpotqa-qwen and
# -qwen-b, joined): a larger --limit grows a run, computing only the new questions.
# The runs of 2026-11-26 and before list dpr-ais-rerank where this script now says dpr-ais-sum: without a
# cross-encoder that method computed dpr-ais-sum (issue M renamed it), so resuming them needs the old name.
set -euo pipefail
INDEX=${INDEX:-$HOME/.cache/ragate/indexes/pooled-dense}
LIMIT=${LIMIT:-300}
MODELS=${MODELS:-"qwen2.5-coder-1.5b"}
DATASETS=${DATASETS:-"nq-open-oracle hotpotqa"}
WORKERS=${WORKERS:-2}
SWEEP=${SWEEP:-1}
DYNAMIC=${DYNAMIC:-1}
RAGATE=${RAGATE:-.venv/bin/ragate}
DYNAMIC_METHODS=etc,dragin,flare,ircot,ralm,single-rag,wo-rag
ALL=no-retrieval,standard-rag,llm-judge,hyde,q2d,cot,dtr,dtr-no-ugt,dpr-ais,dpr-ais-dynamic,dpr-ais-sum,pairs,pairs-exclude-num,targ-entropy,targ-margin,targ-variance,random
NOT_SWEPT=no-retrieval,hyde,q2d,cot,dpr-ais,dpr-ais-dynamic,dpr-ais-sum,pairs,pairs-exclude-num
GATES=dtr,llm-judge,random,targ-entropy,targ-margin,targ-variance
# the comparisons docs/results.md makes beyond each method against never and always retrieving (paired intervals)
COMPARE=(--compare dpr-ais:dtr-no-ugt --compare dtr:dtr-no-ugt --compare pairs:dpr-ais --compare pairs-exclude-num:dpr-ais
  --compare pairs-exclude-num:pairs --compare dpr-ais-dynamic:dpr-ais --compare dpr-ais-sum:dpr-ais
  --compare hyde:q2d --compare cot:hyde)
# docs/dynamic.md's paired comparisons: each dynamic method against Single RAG, retrieval against none, ETC vs DRAGIN
DYNAMIC_COMPARE=(--compare etc:single-rag --compare dragin:single-rag --compare flare:single-rag
  --compare ircot:single-rag --compare ralm:single-rag --compare single-rag:wo-rag --compare etc:dragin)
# ACCEPT_REBUILT=1: resume runs whose index was rebuilt from the same passages (docs/evaluation.md)
ACCEPT=(); [ "${ACCEPT_REBUILT:-0}" = 1 ] && ACCEPT=(--accept-rebuilt-index)
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "no index at $INDEX: ragate corpus build && ragate index build --corpus ~/.cache/ragate/corpora/pooled/passages.jsonl --kind dense --out $INDEX" >&2
  exit 2
fi
resume() { [ -f "$1/config.json" ] && echo --resume || true; }
for model in $MODELS; do
  for dataset in $DATASETS; do
    sweep=docs/results/runs/sweep-$dataset-$model-$LIMIT
    out=docs/results/runs/$dataset-$model-$LIMIT
    with_sweep=()
    methods=$ALL
    if [ "$SWEEP" = 1 ]; then
      # a finished sweep (pass 2 written) is left as it is, report included: it may have gained gates and a
      # budget table since (scripts/targ_baselines.sh), which a plain report would overwrite
      if [ ! -f "$sweep/sweep.json" ]; then
        "$RAGATE" sweep --dataset "$dataset" --methods "$GATES" --index "$INDEX" --model "$model" \
          --limit "$LIMIT" --out "$sweep" --workers "$WORKERS" $(resume "$sweep") "${ACCEPT[@]}"
        "$RAGATE" report "$sweep" --metric acc
      fi
      methods=$NOT_SWEPT
      with_sweep=(--sweep "$sweep")
    fi
    "$RAGATE" eval --dataset "$dataset" --methods "${EVAL_METHODS:-$methods}" --index "$INDEX" --model "$model" \
      --limit "$LIMIT" --out "$out" --workers "$WORKERS" $(resume "$out") "${ACCEPT[@]}"
    compare=(); [ -n "${EVAL_METHODS:-}" ] || compare=("${COMPARE[@]}")  # all 17 methods are there to pair
    "$RAGATE" report "$out" --metric acc "${with_sweep[@]}" "${compare[@]}"
    "$RAGATE" report "$out" --metric em --out "$out/report-em" "${with_sweep[@]}" "${compare[@]}"
  done
  if [ "$DYNAMIC" = 1 ]; then
    out=docs/results/runs/dynamic-hotpotqa-$model-$LIMIT
    "$RAGATE" eval --dataset hotpotqa --methods "$DYNAMIC_METHODS" --index "$INDEX" --model "$model" \
      --limit "$LIMIT" --out "$out" --workers "$WORKERS" $(resume "$out") "${ACCEPT[@]}"
    "$RAGATE" report "$out" --metric acc "${DYNAMIC_COMPARE[@]}"
    "$RAGATE" report "$out" --metric em --out "$out/report-em" "${DYNAMIC_COMPARE[@]}"
  fi
done
