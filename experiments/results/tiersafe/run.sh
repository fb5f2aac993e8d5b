#!/bin/bash
# Cold-home rule in a tier (docs/experiments.md): every variant's measurement, simulated time.
# Run from the worktree root: PYTHONPATH=$PWD:$PWD/protos CACHEROUTE_DATA=... experiments/results/tiersafe/run.sh
# A at a tier of 1 is M (share 1.0 passes the share gate), A+B at a tier of 1 is B: bound_drift and
# Mooncake run one router, so only M, B and N run there (checked once: tier1-identity below).
set -e
R=experiments/results/tiersafe
CPU=/work/wt/cpu
declare -A K=(
  [M]='{"cold_share": false, "cold_backlog": false}'
  [A]='{"cold_share": true, "cold_backlog": false}'
  [B]='{"cold_share": false, "cold_backlog": true}'
  [AB]='{"cold_share": true, "cold_backlog": true}'
  [N]='{"cold_home": null}'
)
for v in ${VARIANTS:-M B N A AB}; do
  case $v in A|AB) tiers=4 ;; *) tiers=1,4 ;; esac
  $CPU .venv/bin/python -m experiments.bound_tenants --policies cacheroute --knobs "${K[$v]}" --tier $tiers \
      --rates 16,24 --seeds 1,2 --out $R/tenants-$v.jsonl > /dev/null
done
for v in ${DRIFT:-M B N}; do
  $CPU .venv/bin/python -m experiments.bound_drift --knobs "${K[$v]}" --rates 16,24 --seeds 1,2 \
      --out $R/drift-$v.jsonl > /dev/null
done
