"""A dispatcher keeps answering while it installs a large plan (issue 22): the plan is decoded,
indexed and prepared off its event loop and swapped in at once.

Processes as in production (services/local/stack.py); probes on gRPC Route and HTTP /health every
5 ms from this process while a 400,000-key plan is activated. Bounded and robust on a loaded
machine: no probe may fail and none may wait more than MAX_WAIT (or 4x the idle noise), and
the dispatcher must route by the new plan. Checked to fail when the decode runs on the loop.
"""

from __future__ import annotations

import sys
from pathlib import Path

from clients.client import CacheRouteClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import install_stall  # noqa: E402

KEYS = 400_000
# Seconds a probe may wait during the install, or 4x the longest wait in the idle second before
# it when the machine is that loaded. Measured at load 6-9, 200k-400k keys: 0.09-0.26 s with the decode off the
# loop; 0.78-1.03 s with the same columnar decode run on the loop (and seconds before this work).
MAX_WAIT = 0.5


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
    bound = max(MAX_WAIT, 4 * max(probes.idle))
    assert max(waits) < bound, f"a probe waited {max(waits):.2f}s (idle: {max(probes.idle):.2f}s)"
    assert probes.routed_at is not None, "the dispatcher never routed by the new plan"
