#!/bin/bash
# Mooncake conversation @4/8 QPS, cacheroute only, one run per variant (docs/experiments.md, status table's command)
set -e
R=experiments/results/tiersafe
for v in ${VARIANTS:-M B N}; do
  case $v in
    M) knobs=(--policy-knob cold_share=false --policy-knob cold_backlog=false) ;;
    B) knobs=(--policy-knob cold_share=false --policy-knob cold_backlog=true) ;;
    N) knobs=(--policy-knob cold_home=null) ;;
  esac
  /work/wt/cpu .venv/bin/cacheroute sim compare --trace $CACHEROUTE_DATA/mooncake/conversation_trace.first_half.jsonl \
      --profile llama3-8b-h100 --replicas 8 --policies cacheroute --qps-grid 4,8 --slo-p99 20 --first-plan-at 5 \
      --jobs 1 "${knobs[@]}" --out $R/mooncake-$v > /dev/null
done
