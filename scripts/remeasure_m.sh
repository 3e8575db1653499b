#!/usr/bin/env bash
# Issue M's re-measure (docs/results.md, "Issue M re-measure"): what the faithful settings touch, at n = 300 on the
# same questions as the runs before them, each step resumable (rerun this script after a kill; only missing
# answers are computed). Three runs, each one process pinned to one core: 1 then 3 on CORE_A, 2 on CORE_B:
#   1. ETC and DRAGIN on HotpotQA (dynamic; the question in every query, no cap, the authors' progress rule);
#   2. NQ-open-oracle: DPR-AIS, PAIRS, pairs-lenient, dpr-ais-sum, DTR's dual path with 1024-token pseudo-contexts,
#      Standard RAG with PAIRS's prompts (the reader-prompt ablation), TARG's reader question-first, no-retrieval;
#   3. HotpotQA: the same methods.
# Then the paired tables: scripts/paired_runs.py (new against old rows) and scripts/dynamic_queries.py.
#   bash scripts/remeasure_m.sh
set -euo pipefail
INDEX=${INDEX:-$HOME/.cache/ragate/indexes/pooled-dense}
MODEL=${MODEL:-qwen2.5-coder-1.5b}
LIMIT=${LIMIT:-300}
RAGATE=${RAGATE:-.venv/bin/ragate}
R=docs/results/runs
SINGLE=no-retrieval,dpr-ais,pairs,pairs-lenient,dpr-ais-sum,dtr-no-ugt,standard-rag-pairs-prompts,targ-always
CORE_A=${CORE_A:-0}
CORE_B=${CORE_B:-1}

run() {  # CORE DATASET METHODS OUT
  local resume=(); [ -f "$4/config.json" ] && resume=(--resume)
  taskset -c "$1" "$RAGATE" eval --dataset "$2" --methods "$3" --index "$INDEX" --model "$MODEL" --limit "$LIMIT" \
    --workers 1 --quiet --out "$4" "${resume[@]}"
}

(
  run "$CORE_A" hotpotqa etc,dragin "$R/dynamic-m-hotpotqa-$MODEL-$LIMIT"
  run "$CORE_A" hotpotqa "$SINGLE" "$R/hotpotqa-m-$MODEL-$LIMIT"
) &
run "$CORE_B" nq-open-oracle "$SINGLE" "$R/nq-open-oracle-m-$MODEL-$LIMIT"
wait

.venv/bin/python scripts/dynamic_queries.py "$R/dynamic-hotpotqa-$MODEL-$LIMIT" "$R/dynamic-m-hotpotqa-$MODEL-$LIMIT" \
  --methods etc,dragin
