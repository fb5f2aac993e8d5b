"""Beyond the paper: session-aware cold tail, shadow gate, fallback, failure repair, byte-aware
admission (docs/experiments.md, "Beyond the paper")."""
