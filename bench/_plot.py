"""What the benchmarks' figures share (``--plot DIR``): a figure, its PNG, the colours. Each bench
draws its own figure from the results it returns; this module imports no bench. matplotlib (the
``plot`` extra) is imported only when a plot is drawn, through ``Figure`` and the Agg canvas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The pipeline's series, the baseline's (direct write, per-rank messages, HEAD each), a floor.
PIPELINE, DIRECT, FLOOR = "tab:blue", "tab:red", "tab:gray"


def require() -> None:
    """Fail before a long run, not after it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'ckpt-pipeline[plot]'") from None


def figure(title: str, panels: int = 1) -> tuple[Any, list[Any]]:
    """A figure of ``panels`` axes side by side, drawn by Agg."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # PNG through Agg whatever the environment's backend
    fig.suptitle(title, fontsize=11)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    return fig, axes


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
