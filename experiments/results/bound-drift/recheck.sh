#!/bin/bash
# the before/after re-check of the cold-home rule (docs/experiments.md, "Drift in the engine-bound regime"),
# simulated time; run from anywhere, results under $O
cd "$(dirname "$0")/../../.."
O=${O:-/tmp/bound-drift-recheck}
mkdir -p "$O"
for tag in before after; do
  if [ $tag = before ]; then PK="--policy-knob cold_home=null"; KN='{"cold_home": null}'; else PK=""; KN='{}'; fi
  for seed in 0 1; do
    nice -n 19 .venv/bin/cacheroute sim compare --workload flagship --active-set 4864 --knob shared_tokens=4096 --knob context_median=2048 --kv-blocks 19388 --policies cacheroute --qps-grid 100,125,150,175 --slo-p99 3.5 --duration 150 --warmup 60 --first-plan-at 5 --jobs 2 --q-cap 6.5 --seed $seed $PK --out $O/flagship-$tag-s$seed > $O/flagship-$tag-s$seed.log 2>&1
    nice -n 19 .venv/bin/cacheroute sim compare --workload paper --active-set 256 --policies cacheroute --qps-grid 150,200,250,275,300 --slo-p99 3.5 --duration 150 --warmup 60 --first-plan-at 5 --jobs 2 --q-cap 11.125 --seed $seed $PK --out $O/k256-$tag-s$seed > $O/k256-$tag-s$seed.log 2>&1
  done
  nice -n 19 .venv/bin/python -m experiments.bound_tenants --policies cacheroute --rates 16,24 --seeds 1,2 --knobs "$KN" > $O/bt-$tag.jsonl 2>$O/bt-$tag.err
  for w in whales tenants drift; do
    nice -n 19 .venv/bin/python -m experiments.bound_drift --workload $w --rates 16,24 --seeds 1,2 --knobs "$KN" > $O/bd-$w-$tag.jsonl 2>$O/bd-$w-$tag.err
  done
done
echo done
