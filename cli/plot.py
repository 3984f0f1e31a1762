"""Writing `fsched simulate --plot FILE`: a self-contained HTML page (the vendored uPlot inlined, works
offline) or a PNG (matplotlib, the optional `plot` extra). The figures come from core/sim/plotdata.py."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

from fsched.cli.common import UserError

PLOT_SUFFIXES = (".html", ".png")
CLASS_COLOURS = {"realtime": "#d62728", "streaming": "#ff7f0e", "batch": "#1f77b4"}
TENANT_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 1em 0 0.3em; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
"""


def check_plot_path(path: Path) -> None:
    """Refuse a --plot file fsched cannot write, before any simulation runs."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UserError(f"--plot: {path} must end in .html or .png")
    if not path.parent.exists():
        raise UserError(f"--plot: folder {path.parent} does not exist")
    if path.suffix.lower() == ".png":
        _matplotlib()


def write_plot(path: Path, data: dict) -> None:
    if path.suffix.lower() == ".png":
        write_png(path, data)
    else:
        path.write_text(html_page(data), encoding="utf-8")


def _web(name: str) -> str:
    return resources.files("fsched.core").joinpath("data", "web", name).read_text(encoding="utf-8")


def html_page(data: dict) -> str:
    """One file with everything inlined: uPlot, its CSS, the data and the drawing script."""
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(data['title'])}</title>\n"
        f"<style>{_web('uPlot.min.css')}\n{PAGE_STYLE}</style>\n"
        f"<!-- uPlot 1.6.32, MIT licence:\n{html.escape(_web('uPlot.LICENSE'))}-->\n"
        f"<script>{_web('uPlot.iife.min.js')}</script>\n</head><body><div id=\"plots\"></div>\n"
        f"<script>window.FSCHED_PLOT = {payload};</script>\n<script>{_web('simulate_plot.js')}</script>\n"
        "</body></html>\n"
    )


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot FILE.png needs matplotlib: pip install 'fsched[plot]' "
                        "(or write FILE.html, which needs nothing)") from None
    return plt


def write_png(path: Path, data: dict) -> None:
    plt = _matplotlib()
    policies = data["policies"]
    fig, axes = plt.subplots(len(policies), 3, figsize=(15, 3.4 * len(policies)), squeeze=False)
    for row, p in zip(axes, policies, strict=True):
        _cdf_axes(row[0], p)
        _share_axes(row[1], p)
        _queue_axes(row[2], p)
        row[0].set_ylabel(p["policy"], fontsize=12, fontweight="bold")
    fig.suptitle(data["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cdf_axes(ax, p: dict) -> None:
    for c, points in p["cdf"].items():
        ax.step(points["x"], points["y"], where="post", color=CLASS_COLOURS.get(c), label=c)
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_title("first-token latency CDF", fontsize=10)
    ax.set_xlabel("seconds from arrival to first token")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)


def _share_axes(ax, p: dict) -> None:
    for i, (tenant, series) in enumerate(p["shares"].items()):
        colour = TENANT_COLOURS[i % len(TENANT_COLOURS)]
        ax.plot(p["time"], [float("nan") if v is None else v for v in series], color=colour,
                label=f"{tenant} served")
        ax.plot(p["time"], [float("nan") if v is None else v for v in p["entitled"][tenant]], color=colour,
                linestyle="--", linewidth=1, label=f"{tenant} entitled")
    ax.set_ylim(0, 1)
    ax.set_title(f"served share (last {p.get('window_s', 0):g} s) vs entitled", fontsize=10)
    ax.set_xlabel("simulated seconds")
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    ax.grid(alpha=0.3)


def _queue_axes(ax, p: dict) -> None:
    for c, series in p["waiting"].items():
        ax.plot(p["time"], series, color=CLASS_COLOURS.get(c), label=f"{c} waiting")
    ax.plot(p["time"], p["running"], color="#7f7f7f", linestyle="--", linewidth=1, label="running")
    ax.set_title("queue depth", fontsize=10)
    ax.set_xlabel("simulated seconds")
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    ax.grid(alpha=0.3)
