"""Output helpers every benchmark shares: a printed table, a JSON file, a PNG plot."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def bench_setup(cls: type[T], args: Any, quick: list[str]) -> tuple[T, Path]:
    """The benchmark's typed options (`--quick` presets first, then `--set`) and its output folder."""
    from rollhub.core.config import load_config

    overrides = [*quick, *args.overrides] if args.quick else list(args.overrides)
    config = load_config(cls, None, overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return config, out


def _format(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    """Print rows as a rich table (plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    if not rows:
        return
    if columns is None:
        columns = []
        for row in rows:
            columns += [key for key in row if key not in columns]
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(_format(row.get(c, "")) for c in columns))
    Console(width=max(100, 14 * len(columns))).print(table)


def save_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def save_plot(path: str | Path, draw: Callable[..., None], *args: Any, panels: int = 1) -> Path:
    """Draw with `draw(ax, *args)` (or `draw(axes, *args)` for several panels) into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    draw(axes, *args)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_result(out: Path, result: Any, plot: str, draw: Callable[..., None], *args: Any) -> None:
    """Write `out/result.json` and the PNG `out/plot` drawn by `draw(ax, *args)`, and say where."""
    save_json(out / "result.json", result)
    save_plot(out / plot, draw, *args)
    print(f"wrote {out / 'result.json'} and {out / plot}")
