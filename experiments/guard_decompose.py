"""Which change costs what: the planner lifecycle (experiments.run planner-k*) at one point, with
the cacheroute overload guard off/on x the switching rule's queueing term off/on (4 runs).

  .venv/bin/python -m experiments.guard_decompose K QPS Q_CAP     e.g. 256 100 11.125
"""

from __future__ import annotations

import sys
from dataclasses import replace

from experiments.drift import plan_fn_for
from services.core.policies import make_policy
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.switching import SwitchConfig
from services.sim.runs import RunSpec, config_for, load_requests
from services.sim.simulator import Simulator


def main(argv: list[str]) -> int:
    k, qps, q_cap = int(argv[0]), float(argv[1]), float(argv[2])
    base = RunSpec(policy="cacheroute", qps=qps, duration=150.0, warmup=60.0, first_plan_at=5.0,
                   workload_knobs={"active_set": k}, q_cap=q_cap)
    reqs = load_requests(base)
    prefix = {q.key: q.prefix_tokens for q in reqs}
    for guard in (None, BALANCE_FACTOR):
        for weight in (0.0, 1.0):
            fn = plan_fn_for("planner", prefix, SwitchConfig(queue_weight=weight))
            out = Simulator(replace(config_for(base), plan_fn=fn),
                            make_policy("cacheroute", base.replicas, seed=0, balance_factor=guard), reqs).run().as_dict()
            switches = sum(d["switch"] for d in fn.decisions)
            print(f"K={k} {qps:g} QPS guard={guard} queue_weight={weight:g}: hit {out['hit_rate']:.3f} "
                  f"p99 {out['ttft_p99']:.2f} s imbalance {out['imbalance']:.2f} switches {switches}/{len(fn.decisions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
