"""A dispatcher keeps answering while it installs a large plan (issue 22): the plan is decoded,
indexed and prepared off its event loop and swapped in at once.

Processes as in production (services/stack.py); probes on gRPC Route and HTTP /health every
5 ms from this process while a 200,000-key plan is activated. Bounded and robust on a loaded
machine: no probe may fail and none may wait more than MAX_WAIT (generous: before this work
the loop decoded such a plan in one go, seconds without an answer), and the dispatcher must
route by the new plan.
"""

from __future__ import annotations

import sys
from pathlib import Path

from clients.client import CacheRouteClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import install_stall  # noqa: E402

KEYS = 200_000
MAX_WAIT = 2.0          # seconds; the goal on a quiet machine is 0.05-0.1 (bench/install_stall.py)


def test_a_dispatcher_keeps_answering_while_it_installs_a_large_plan():
    stack = install_stall.start_stack(engines=2)
    try:
        with CacheRouteClient(planner=stack.planner, max_message_bytes=64 * 1024 * 1024, timeout=300) as client:
            version, probe_key, _ = install_stall.build(client, KEYS, 1, 2)
            probes, activated = install_stall.activate_with_probes(stack, client, version, 0, probe_key,
                                                                   after=0.5, limit=120)
    finally:
        stack.stop()
    waits = probes.route + probes.health
    assert not probes.failures, probes.failures[:3]
    assert len(probes.route) > 20 and len(probes.health) > 20
    assert max(waits) < MAX_WAIT, f"a probe waited {max(waits):.2f}s"
    assert probes.routed_at is not None, "the dispatcher never routed by the new plan"
