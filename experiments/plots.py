"""Plots for experiments that `cacheroute sim compare` does not draw."""

from __future__ import annotations


def drift_series(out: dict, path: str) -> str:
    """Hit rate over time per plan-lifecycle mode, plan installs marked on the time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, m in out["modes"].items():
        s = m["series"]
        ys = [float("nan") if y is None else 100 * y for y in s["hit_rate"]]
        line, = ax.plot(s["t"], ys, label=mode, linewidth=1.2)
        for rec in m["installs"]:
            ax.axvline(rec["at"], color=line.get_color(), alpha=0.25, linewidth=0.8)
    interval = out["setup"]["interval"]
    ax.set_xlim(interval, out["setup"]["duration"])
    ax.set_xlabel("arrival time (s); faint lines: plan installs")
    ax.set_ylabel(f"hit rate (%), {out['setup']['bin_seconds']:g} s bins")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
