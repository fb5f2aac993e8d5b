#!/bin/bash
# Re-check after the verdict (not part of the adoption rule): seed 3, OFF vs BUS 0.1 s memory on
set -e
R=experiments/results/bussim
rm -f $R/tenants-s3.jsonl $R/drift-s3.jsonl
/work/wt/cpu .venv/bin/python -m experiments.bound_tenants --policies cacheroute --tier 1,2,4 --rates 16,24 --seeds 3 \
    --tier-record-delay none,0.1 --tier-record-memory on --out $R/tenants-s3.jsonl > /dev/null
/work/wt/cpu .venv/bin/python -m experiments.bound_drift --tier 1,2,4 --rates 16,24 --seeds 3 \
    --tier-record-delay none,0.1 --tier-record-memory on --out $R/drift-s3.jsonl > /dev/null
