"""The pure core: planning, policies, engine model, workloads, metrics. No I/O, no clock reads."""
