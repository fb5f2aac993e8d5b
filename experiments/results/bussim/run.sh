#!/bin/bash
# The record bus in the simulator (docs/experiments.md): (a) tenants and (d) drift, simulated time.
# Run from the worktree root: PYTHONPATH=$PWD:$PWD/protos CACHEROUTE_DATA=... experiments/results/bussim/run.sh
set -e
R=experiments/results/bussim
CPU=/work/wt/cpu
rm -f $R/tenants.jsonl $R/drift.jsonl
$CPU .venv/bin/python -m experiments.bound_tenants --policies cacheroute --tier 1,2,4 --rates 16,24 --seeds 1,2 \
    --tier-record-delay none,0.1,0.5 --tier-record-memory on,off --out $R/tenants.jsonl > /dev/null
$CPU .venv/bin/python -m experiments.bound_drift --tier 1,2,4 --rates 16,24 --seeds 1,2 \
    --tier-record-delay none,0.1,0.5 --tier-record-memory on,off --out $R/drift.jsonl > /dev/null
# Mooncake conversation @4/8 QPS, one trace (the re-check); delays in virtual seconds (unscaled trace)
rm -f $R/mooncake.jsonl
$CPU .venv/bin/python -m experiments.bus_mooncake --tier 1,4 --record-delay none,0.1,0.5 --record-memory on,off \
    --out $R/mooncake.jsonl > /dev/null
