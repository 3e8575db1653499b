#!/usr/bin/env bash
# The runs behind docs/results.md's budget-matched table (issue J, TARG Tables 3-4) for one dataset:
#   1. SKR's training split: a targ-margin sweep of questions OFFSET..OFFSET+TRAIN (the skr family's answers),
#      then `ragate skr fit` (labels: retrieval answer better than closed-book by METRIC; with TARG's prompt
#      Qwen answers in sentences, so EM would label almost nothing "retrieve": the default is acc);
#   2. the test split's sweep (questions 0..LIMIT) gains self-eval, self-rag-lite and skr on its stored answers;
#   3. CRAG-lite, which has no threshold, evaluated once on the first CRAG_LIMIT of them, and FLARE at each theta of
#      FLARE_THETAS (TARG Table 3: 0.3 and 0.5) on the first FLARE_LIMIT of them (FLARE is the dearest: ~40 s
#      a question with Qwen2.5-Coder-1.5B on one core);
#   4. `ragate report --budgets` of the sweep with the CRAG-lite and FLARE runs as single points.
# Every step resumes: rerun after a kill and only the missing answers are computed.
#   DATASET=nq-open-oracle LIMIT=300 OFFSET=300 TRAIN=300 bash scripts/targ_baselines.sh
#   DATASET=musique LIMIT=250 OFFSET=250 TRAIN=250 CRAG_LIMIT=200 FLARE_LIMIT=200 FLARE_THETAS=0.5 \
#     GATES=llm-judge,random,targ-entropy,targ-margin,targ-variance bash scripts/targ_baselines.sh
# (GATES: the swept gates besides self-eval, self-rag-lite and skr; TARG Table 3 needs the TARG family and the
# question-retrieval family that FLARE is compared with, not DTR's dearer DPR-AIS family.)
set -euo pipefail
DATASET=${DATASET:-nq-open-oracle}
MODEL=${MODEL:-qwen2.5-coder-1.5b}
INDEX=${INDEX:-$HOME/.cache/ragate/indexes/pooled-dense}
LIMIT=${LIMIT:-300}
OFFSET=${OFFSET:-$LIMIT}
TRAIN=${TRAIN:-$LIMIT}
WORKERS=${WORKERS:-2}
BUDGETS=${BUDGETS:-0.05,0.1,0.15,0.2,0.3,0.4,0.6}
METRIC=${METRIC:-acc}
RAGATE=${RAGATE:-.venv/bin/ragate}
GATES=${GATES:-dtr,llm-judge,random,targ-entropy,targ-margin,targ-variance}
RUNS=${RUNS:-docs/results/runs}
FLARE_THETAS=${FLARE_THETAS:-0.3,0.5}
FLARE_LIMIT=${FLARE_LIMIT:-$LIMIT}
CRAG_LIMIT=${CRAG_LIMIT:-$LIMIT}
# ACCEPT_REBUILT=1: resume a sweep whose index was rebuilt from the same passages (docs/evaluation.md)
ACCEPT=(); [ "${ACCEPT_REBUILT:-0}" = 1 ] && ACCEPT=(--accept-rebuilt-index)
if [ ! -f "$INDEX/manifest.json" ]; then
  echo "no index at $INDEX: ragate corpus build && ragate index build --corpus ~/.cache/ragate/corpora/pooled/passages.jsonl --kind dense --out $INDEX" >&2
  exit 2
fi
if [ "$OFFSET" -lt "$LIMIT" ]; then
  echo "OFFSET ($OFFSET) must be >= LIMIT ($LIMIT): SKR's training questions come after the test questions" >&2
  exit 2
fi
resume() { [ -f "$1/config.json" ] && echo --resume || true; }

train=$RUNS/sweep-$DATASET-$MODEL-train-$OFFSET-$TRAIN
labels=$RUNS/skr-$DATASET-$MODEL-train-$OFFSET-$TRAIN.npz
"$RAGATE" sweep --dataset "$DATASET" --methods targ-margin --index "$INDEX" --model "$MODEL" \
  --offset "$OFFSET" --limit "$TRAIN" --out "$train" --workers "$WORKERS" $(resume "$train") "${ACCEPT[@]}"
# fit once, after the training sweep is complete (set -e: a killed step 1 leaves no label file); never refit an
# existing label set: the test sweep's skr decisions came from it (a refit on another machine differs in the
# encoder's last bits, and the sweep refuses to resume with it)
if [ ! -f "$labels" ]; then
  "$RAGATE" skr fit --sweep "$train" --out "$labels" --metric "$METRIC"
fi

test=$RUNS/sweep-$DATASET-$MODEL-$LIMIT
"$RAGATE" sweep --dataset "$DATASET" --methods "$GATES,self-eval,self-rag-lite,skr" --skr-labels "$labels" \
  --index "$INDEX" --model "$MODEL" --limit "$LIMIT" --out "$test" --workers "$WORKERS" $(resume "$test") \
  "${ACCEPT[@]}"

crag=$RUNS/$DATASET-$MODEL-$CRAG_LIMIT-crag-lite
"$RAGATE" eval --dataset "$DATASET" --methods crag-lite --index "$INDEX" --model "$MODEL" --limit "$CRAG_LIMIT" \
  --out "$crag" --workers "$WORKERS" $(resume "$crag") "${ACCEPT[@]}"

points=(--with "$crag")
for theta in ${FLARE_THETAS//,/ }; do
  flare=$RUNS/$DATASET-$MODEL-$FLARE_LIMIT-flare-$theta
  "$RAGATE" eval --dataset "$DATASET" --methods flare --threshold "flare=$theta" --index "$INDEX" \
    --model "$MODEL" --limit "$FLARE_LIMIT" --out "$flare" --workers "$WORKERS" $(resume "$flare") "${ACCEPT[@]}"
  points+=(--with "$flare")
done

"$RAGATE" report "$test" --budgets "$BUDGETS" "${points[@]}" --metric "$METRIC"
