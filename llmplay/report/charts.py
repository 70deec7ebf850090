"""matplotlib charts of archived data, each returned as an inline SVG string (no pyplot state, text kept as text)."""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar  # Any: matplotlib's rcParams keys (see _STYLE)

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from llmplay.archive.capacity import CapacityResult

P = ParamSpec("P")
R = TypeVar("R")

BASELINE_COLOR, CANDIDATE_COLOR = "#3b6ea8", "#d9822b"
ROLE_COLORS = {"baseline": BASELINE_COLOR, "candidate": CANDIDATE_COLOR}
GRID = "#dddddd"
MAX_POINTS = 400  # per line: keeps each SVG a few tens of kB, far below what a screen resolves
# Any keys: matplotlib types rcParams keys as a Literal union that a plain str dict cannot satisfy
_STYLE: dict[Any, Any] = {  # matplotlib's rcParams keys
    "svg.fonttype": "none",  # text stays <text>, not glyph paths: small files, selectable, crisp when printed
    "svg.hashsalt": "llmplay",  # stable element ids: the same archive renders the same bytes
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": GRID,
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


def _figure(
    width_in: float,
    height_in: float,
    ncols: int = 1,
    nrows: int = 1,
    *,
    left_in: float = 0.62,
    bottom_in: float = 0.48,
    top_in: float = 0.3,
    gap_in: float = 0.72,
) -> tuple[Figure, list[Axes]]:
    """Fixed margins in inches: a constrained layout measures every tick label and would double the render time."""
    fig = Figure(figsize=(width_in, height_in))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    right_in = 0.12
    axis_w = (width_in - left_in - right_in - (ncols - 1) * gap_in) / ncols
    fig.subplots_adjust(
        left=left_in / width_in,
        right=1 - right_in / width_in,
        bottom=bottom_in / height_in,
        top=1 - top_in / height_in,
        wspace=gap_in / axis_w if ncols > 1 else 0.2,
    )
    return fig, [ax for row in axes for ax in row]


def _styled(func: Callable[P, R]) -> Callable[P, R]:
    """Run a chart function under our rcParams: artists read them when created and when saved."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context(_STYLE):
            return func(*args, **kwargs)

    return wrapper


def to_svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE: the SVG lives inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    # HTML parses inline SVG into its namespace by itself; the declarations only add URLs to the file
    svg = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", svg)
    svg = re.sub(r'\s+width="[\d.]+pt" height="[\d.]+pt"', "", svg, count=1)  # scale with the page (viewBox kept)
    return svg.replace("<svg ", '<svg class="chart" role="img" ', 1)


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= MAX_POINTS:
        return x, y
    idx = np.unique(np.linspace(0, len(x) - 1, MAX_POINTS).round().astype(int))
    return x[idx], y[idx]


def _not_measured(ax: Axes, text: str = "not measured") -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#888888", fontsize=10)


def _ms(ax: Axes, axis: str = "x") -> None:
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)("ms")


@_styled
def latency_cdfs(panels: Sequence[tuple[str, Mapping[str, np.ndarray]]], width_in: float = 9.0) -> str:
    """One CDF panel per metric (title, {label: values in seconds}); x in ms, log scale when the range is wide."""
    fig, axes = _figure(width_in, 2.4, ncols=max(len(panels), 1))
    for ax, (title, series) in zip(axes, panels, strict=False):
        ax.set_title(title)
        drawn = False
        for label, values in series.items():
            values = np.sort(np.asarray(values, dtype=float)[np.isfinite(values)]) * 1000
            if not values.size:
                continue
            y = np.arange(1, values.size + 1) / values.size
            x, y = _thin(values, y)
            color = ROLE_COLORS.get(label.split(" ")[0])
            ax.step(x, y, where="post", label=f"{label} (n={values.size})", color=color, linewidth=1.4)
            drawn = True
        if not drawn:
            _not_measured(ax)
            continue
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="#999999", linewidth=0.5, linestyle=":")
        ax.set_ylim(0, 1.01)
        ax.set_ylabel("share of requests")
        _ms(ax)
        pooled = np.concatenate([np.asarray(v, dtype=float) for v in series.values()]) * 1000
        pooled = pooled[np.isfinite(pooled) & (pooled > 0)]
        if pooled.size and np.percentile(pooled, 99.5) / np.percentile(pooled, 1) > 20:
            ax.set_xscale("log")  # a long tail would squash the body of the distribution into one pixel column
        ax.legend(loc="lower right")
    return to_svg(fig)


@_styled
def trial_points(
    title: str, unit_label: str, points: Sequence[tuple[str, str, float]], scale: float = 1.0, width_in: float = 2.9
) -> str:
    """Each trial's value of the objective (role, trial_id, value): the spread a verdict rests on."""
    fig, (ax,) = _figure(width_in, 2.6)
    ax.set_title(title)
    roles = [r for r in ("baseline", "candidate") if any(p[0] == r for p in points)]
    if not roles:
        _not_measured(ax, "no successful trial")
        return to_svg(fig)
    for i, role in enumerate(roles):
        vals = np.array([p[2] for p in points if p[0] == role], dtype=float) * scale
        ids = [p[1] for p in points if p[0] == role]
        xs = i + np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.array([float(i)])
        ax.scatter(xs, vals, color=ROLE_COLORS[role], s=28, zorder=3)
        ax.hlines(vals.mean(), i - 0.25, i + 0.25, color=ROLE_COLORS[role], linewidth=1.2)
        for x, v, tid in zip(xs, vals, ids, strict=True):
            ax.annotate(
                tid, (x, v), textcoords="offset points", xytext=(5, 0), fontsize=7, color="#555555", va="center"
            )
    ax.set_xticks(range(len(roles)), roles)
    ax.set_xlim(-0.6, len(roles) - 0.4)
    ax.set_ylabel(unit_label)
    ax.grid(axis="x", visible=False)
    return to_svg(fig)


@_styled
def over_time(series: Sequence[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]], width_in: float = 7.0) -> str:
    """Per trial (role, trial_id, t_s of each completion, output tokens, TTFT s): throughput and TTFT over time."""
    fig, (ax_tp, ax_lat) = _figure(width_in, 2.6, ncols=2)
    span_s = max((float(np.max(t)) for _, _, t, _, _ in series if len(t)), default=1.0)
    # 1 s bins, wider for a window of hours: a bin per second of a week would be 600,000 points to draw
    bin_s = max(1.0, float(np.ceil(span_s / MAX_POINTS)))
    ax_tp.set_title(f"output tokens/s over time ({bin_s:g} s bins)")
    ax_lat.set_title("TTFT of each request over time")
    drawn = False
    ttft_drawn = False  # non-streamed requests have no TTFT (NaN): all of them leave that panel empty
    for role, trial_id, t_s, tokens, ttft in series:
        if not len(t_s):
            continue
        drawn = True
        ttft_drawn = ttft_drawn or bool(np.isfinite(np.asarray(ttft, dtype=float)).any())
        color = ROLE_COLORS.get(role)
        edges = np.arange(0, max(float(np.max(t_s)), 1.0) + bin_s, bin_s)
        counts, _ = np.histogram(t_s, bins=edges, weights=tokens)
        counts = counts / bin_s
        ax_tp.plot(edges[:-1] + bin_s / 2, counts, color=color, linewidth=1.0, alpha=0.8, label=f"{trial_id} {role}")
        x, y = _thin(np.asarray(t_s), np.asarray(ttft) * 1000)
        ax_lat.scatter(x, y, color=color, s=5, alpha=0.5, linewidths=0)
    if not drawn:
        _not_measured(ax_tp)
        _not_measured(ax_lat)
        return to_svg(fig)
    ax_tp.set_xlabel("s since the measured window began")
    ax_tp.set_ylabel("tok/s")
    if ttft_drawn:
        ax_lat.set_xlabel("s since the measured window began")
        _ms(ax_lat, "y")
    else:
        _not_measured(ax_lat, "not measured: no streamed request")
    _, labels = ax_tp.get_legend_handles_labels()
    if len(labels) <= 8:
        ax_tp.legend(loc="lower right", ncols=2)
    return to_svg(fig)


@_styled
def telemetry_panels(
    panels: Sequence[tuple[str, str, Sequence[tuple[str, str, np.ndarray, np.ndarray]]]], width_in: float = 9.0
) -> str:
    """Small multiples (title, y label, [(role, trial_id, t_s, value)]); an empty panel says "not measured"."""
    fig, axes = _figure(width_in, 2.3, ncols=max(len(panels), 1))
    for ax, (title, ylabel, lines) in zip(axes, panels, strict=False):
        ax.set_title(title)
        if not lines:
            _not_measured(ax)
            continue
        for role, _trial_id, t_s, values in lines:
            x, y = _thin(np.asarray(t_s, dtype=float), np.asarray(values, dtype=float))
            ax.plot(x, y, color=ROLE_COLORS.get(role), linewidth=0.9, alpha=0.8)
        ax.set_xlabel("s")
        ax.set_ylabel(ylabel)
    return to_svg(fig)


@_styled
def memory_bar(parts: Sequence[tuple[str, float]], capacity_bytes: float | None, width_in: float = 5.2) -> str:
    """One horizontal stacked bar: weights, KV cache, other; the device capacity as a line."""
    fig, (ax,) = _figure(width_in, 1.5, left_in=0.25, bottom_in=0.45, top_in=0.4)
    colors = ["#3b6ea8", "#d9822b", "#8c8c8c", "#6aa84f"]
    total = sum(v for _, v in parts)
    # against a host's RAM a tiny model is a sliver: then the bar is scaled to itself and the capacity named
    on_scale = bool(capacity_bytes) and total >= 0.05 * float(capacity_bytes or 0)
    top = max(total, float(capacity_bytes or 0) if on_scale else 0.0)
    unit, div = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    left = 0.0
    for (label, value), color in zip(parts, colors, strict=False):
        ax.barh([0], [value / div], left=left, color=color, label=f"{label} {value / div:.3g} {unit}", height=0.5)
        left += value / div
    if capacity_bytes and on_scale:
        cap = capacity_bytes / div
        ax.axvline(cap, color="#b22222", linewidth=1.2)
        ax.text(cap, 0.32, f"capacity {cap:.1f} {unit} ", ha="right", va="bottom", fontsize=8, color="#b22222")
        ax.set_xlim(0, max(cap, left) * 1.02)
    elif capacity_bytes:
        ax.text(
            left,
            0.32,
            f"{total / capacity_bytes:.1%} of the {capacity_bytes / 2**30:.1f} GiB capacity ",
            ha="right",
            va="bottom",
            fontsize=8,
            color="#b22222",
        )
        ax.set_xlim(0, left * 1.02 or 1)
    ax.set_ylim(-0.4, 0.6)
    ax.set_yticks([])
    ax.set_xlabel(unit)
    ax.grid(axis="y", visible=False)
    ax.legend(
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=len(parts),
        borderaxespad=0.2,
        fontsize=7,
        handlelength=1.0,
        columnspacing=1.0,
    )
    return to_svg(fig)


@_styled
def roofline_bar(floor_s: float, achieved_s: float | None, width_in: float = 5.2) -> str:
    """Decode time per token: the bandwidth floor (weights + KV bytes / bandwidth) against the measured TPOT."""
    fig, (ax,) = _figure(width_in, 1.3, left_in=1.15, bottom_in=0.45, top_in=0.1)
    labels = ["bandwidth floor"] + (["achieved TPOT"] if achieved_s else [])
    values = [floor_s * 1000] + ([achieved_s * 1000] if achieved_s else [])
    ax.barh(labels, values, color=["#6aa84f", "#d9822b"][: len(values)], height=0.55)
    for y, v in enumerate(values):
        ax.annotate(f"{v:.2f} ms", (v, y), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.18)
    ax.set_xlabel("ms per output token")
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    return to_svg(fig)


@_styled
def histograms(panels: Sequence[tuple[str, str, np.ndarray]], width_in: float = 9.0) -> str:
    """Workload shape: one histogram per panel (title, x label, values)."""
    fig, axes = _figure(width_in, 2.3, ncols=max(len(panels), 1))
    for ax, (title, xlabel, values) in zip(axes, panels, strict=False):
        ax.set_title(title)
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        if not values.size:
            _not_measured(ax)
            continue
        if np.ptp(values) == 0:
            width = max(abs(values[0]) * 0.05, 1e-9)
            ax.bar([values[0]], [values.size], width=width, color="#3b6ea8")
            ax.set_xlim(values[0] - 10 * width, values[0] + 10 * width)  # one value: show it as a spike
        else:
            ax.hist(values, bins=min(40, max(5, int(np.sqrt(values.size)))), color="#3b6ea8")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("requests")
    return to_svg(fig)


_SEARCH_COLORS = ("#3b6ea8", "#d9822b", "#4d9a5b", "#a8456b", "#7a6bb0", "#8c8c3a")


@_styled
def capacity_attainment(
    configs: Sequence[tuple[str, Sequence[CapacityResult]]], target: float, unit: str, width_in: float = 7.0
) -> str:
    """SLO attainment against load, one colour per configuration: each probe's attainment with its interval, the
    target as a dashed line, and each search's boundary interval as a band with its estimate as a line."""
    fig, (ax,) = _figure(width_in, 3.0)
    drawn = False
    for i, (label, searches) in enumerate(configs):
        color = _SEARCH_COLORS[i % len(_SEARCH_COLORS)]
        for j, search in enumerate(searches):
            probes = sorted((p for p in search.probes if p.attainment is not None), key=lambda p: p.load)
            if not probes:
                continue
            x = np.asarray([p.load for p in probes], dtype=float)
            y = np.asarray([p.attainment for p in probes], dtype=float) * 100
            lo = np.clip(y - np.asarray([p.ci_low for p in probes], dtype=float) * 100, 0, None)
            hi = np.clip(np.asarray([p.ci_high for p in probes], dtype=float) * 100 - y, 0, None)
            ax.errorbar(
                x,
                y,
                yerr=[lo, hi],
                fmt="o-",
                ms=3.5,
                lw=1,
                capsize=2,
                color=color,
                alpha=0.9,
                label=label if j == 0 else None,
            )
            low, high = search.ci
            if low is not None and high is not None:
                ax.axvspan(low, high, color=color, alpha=0.12, lw=0)
            if search.capacity is not None:
                ax.axvline(search.capacity, color=color, lw=1.2, ls="-", alpha=0.8)
            drawn = True
    if not drawn:
        _not_measured(ax, "no capacity probe measured")
        return to_svg(fig)
    ax.axhline(target * 100, color="#b03030", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda x, _: f"{x:g}")  # 4, 8, 16 rather than 4×10⁰
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel(f"load ({unit}, log scale)")
    ax.set_ylabel("requests meeting every SLO (%)")
    ax.set_title("SLO attainment against load (band: boundary CI; line: capacity)")
    ax.legend(loc="lower left")
    return to_svg(fig)


@_styled
def capacity_knee(
    configs: Sequence[tuple[str, Sequence[CapacityResult]]],
    slo_s: Mapping[str, float],
    target: float,
    width_in: float = 9.0,
) -> str:
    """Output throughput against each SLO's latency at the target quantile (P95 for 95%), probe by probe: the knee
    where more load stops buying throughput and starts buying latency; the SLO as a dashed line."""
    keys = list(slo_s) or ["ttft"]
    fig, axes = _figure(width_in, 2.8, ncols=len(keys))
    q = f"P{target * 100:g}"
    for ax, key in zip(axes, keys, strict=True):
        drawn = False
        for i, (label, searches) in enumerate(configs):
            color = _SEARCH_COLORS[i % len(_SEARCH_COLORS)]
            for j, search in enumerate(searches):
                pts = [
                    (p.output_tok_s, p.at_quantile_s[key])
                    for p in sorted(search.probes, key=lambda p: p.load)
                    if p.output_tok_s is not None and p.at_quantile_s.get(key) is not None
                ]
                if not pts:
                    continue
                x = np.asarray([a for a, _ in pts], dtype=float)
                y = np.asarray([b for _, b in pts], dtype=float) * 1000
                ax.plot(x, y, "o-", ms=3.5, lw=1, color=color, alpha=0.9, label=label if j == 0 else None)
                drawn = True
        if not drawn:
            _not_measured(ax)
            continue
        if key in slo_s:
            ax.axhline(slo_s[key] * 1000, color="#b03030", ls="--", lw=1, label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{q} {key.upper()} (ms, log scale)")
        ax.set_title(f"throughput against {q} {key.upper()}")
        ax.legend(loc="upper left")
    return to_svg(fig)


@dataclass(frozen=True)
class TrendPoint:
    """One run on a trend chart: its value with the trial-level interval, and what the chart marks about it."""

    date: str
    value: float
    low: float
    high: float
    engine: str  # the engine version (or label), written where it changes
    config: str  # a fingerprint: a dotted line where it changes
    flag: str = ""  # "regression" | "improvement" | ""
    reference: bool = False  # the accepted reference run


@_styled
def trend(
    title: str,
    unit_label: str,
    points: Sequence[TrendPoint],
    scale: float = 1.0,
    width_in: float = 7.5,
) -> str:
    """A headline metric across a playbook's runs, oldest first: each run's value with its trial-level interval as a
    band, the engine version labelled where it changes, regressions and improvements the history flagged, and the
    accepted reference; a dotted line where the configuration changed."""
    fig, (ax,) = _figure(width_in, 2.7, bottom_in=0.62)
    ax.set_title(title)
    if not points:
        _not_measured(ax, "no verified run measured it")
        return to_svg(fig)
    x = np.arange(len(points), dtype=float)
    y = np.array([p.value for p in points]) * scale
    low = np.array([p.low for p in points]) * scale
    high = np.array([p.high for p in points]) * scale
    ax.fill_between(x, low, high, color=BASELINE_COLOR, alpha=0.18, linewidth=0, label="interval over trials")
    ax.plot(x, y, color=BASELINE_COLOR, linewidth=1.1, marker="o" if len(points) <= 60 else None, markersize=3)
    for flag, marker, color in (("regression", "v", "#c0392b"), ("improvement", "^", "#2e8b57")):
        idx = [i for i, p in enumerate(points) if p.flag == flag]
        if idx:
            ax.scatter(x[idx], y[idx], marker=marker, s=46, color=color, zorder=4, label=flag)
    ref = [i for i, p in enumerate(points) if p.reference]
    if ref:
        ax.scatter(x[ref], y[ref], marker="*", s=110, color="#7a6bb0", zorder=5, label="accepted reference")
    previous = None
    for i, p in enumerate(points):  # the engine version, written where it changes
        if p.engine != previous:
            ax.axvline(x[i] - 0.5 if i else x[i], color="#999999", linewidth=0.7, linestyle="--")
            ax.annotate(
                (p.engine or "?")[:40],
                (x[i], 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                fontsize=7,
                color="#555555",
                rotation=0,
            )
            previous = p.engine
        if i and p.config != points[i - 1].config:
            ax.axvline(x[i] - 0.5, color="#c0392b", linewidth=0.9, linestyle=":")
            ax.annotate(
                "configuration changed",
                (x[i] - 0.5, 0.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color="#c0392b",
            )
    step = max(1, int(np.ceil(len(points) / 8)))
    ticks = list(range(0, len(points), step))
    ax.set_xticks(ticks, [points[i].date[:16].replace("T", " ") for i in ticks], rotation=20, ha="right")
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.set_ylabel(unit_label)
    ax.legend(loc="lower left", ncols=4)
    return to_svg(fig)


@_styled
def arrivals(series: Sequence[tuple[str, str, np.ndarray]], expected_rate: float | None, width_in: float = 7.0) -> str:
    """Per trial (role, trial_id, send time of each measured request in s): the requests sent so far over time,
    beside the straight line of the rate the workload asked for (a trace window's mean replay rate)."""
    fig, (ax,) = _figure(width_in, 2.6)
    ax.set_title("requests sent over time")
    span_s = 0.0
    for role, trial_id, sends in series:
        if not len(sends):
            continue
        x, y = _thin(np.sort(np.asarray(sends, dtype=float)), np.arange(1, len(sends) + 1, dtype=float))
        ax.step(x, y, where="post", color=ROLE_COLORS.get(role), linewidth=1.0, alpha=0.8, label=f"{trial_id} {role}")
        span_s = max(span_s, float(x[-1]))
    if not span_s:
        _not_measured(ax)
        return to_svg(fig)
    if expected_rate:
        ax.plot(
            [0, span_s],
            [1, 1 + expected_rate * span_s],
            color="#888888",
            linestyle="--",
            linewidth=1.0,
            label=f"{expected_rate:.3g} req/s asked",
        )
    ax.set_xlabel("s since the first measured send")
    ax.set_ylabel("requests")
    _, labels = ax.get_legend_handles_labels()
    if len(labels) <= 8:
        ax.legend(loc="upper left", ncols=2)
    return to_svg(fig)


@_styled
def by_turn(lines: Sequence[tuple[str, Sequence[int], Sequence[float]]], width_in: float = 5.2) -> str:
    """TTFT P50 by a conversation's turn index, one line per configuration (label, turn numbers, seconds)."""
    fig, (ax,) = _figure(width_in, 2.6)
    ax.set_title("P50 TTFT by turn of the conversation")
    drawn = [(label, turns, values) for label, turns, values in lines if len(turns)]
    if not drawn:
        _not_measured(ax)
        return to_svg(fig)
    for i, (label, turns, values) in enumerate(drawn):
        color = _SEARCH_COLORS[i % len(_SEARCH_COLORS)]
        ax.plot(list(turns), np.asarray(values, dtype=float) * 1000, marker="o", color=color, label=label)
    ax.set_xlabel("turn")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _ms(ax, "y")
    ax.legend(loc="upper left")
    return to_svg(fig)
