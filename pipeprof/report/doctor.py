"""``pipeprof doctor``: the machine snapshot (``env.snapshot``) as readable tables."""

from __future__ import annotations


def _flat(prefix: str, value, out: list) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for i, v in enumerate(value):
            _flat(f"{prefix}[{i}]", v, out)
    else:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        out.append((prefix, "–" if value is None else text))


def doctor_rows(snap: dict) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section, [(field, value)]) in reading order; a machine without GPUs says so."""
    order = [
        "cpu_model",
        "cores",
        "memory",
        "gpus",
        "torch",
        "libraries",
        "pillow_jpeg",
        "dataset_filesystem",
        "platform",
        "hostname",
    ]
    sections = []
    for key in order:
        rows: list = []
        _flat("", snap.get(key), rows)
        if key == "gpus" and not snap.get("gpus"):
            rows = [("", "none visible to NVML (no NVIDIA driver): GPU trials will run on the CPU")]
        sections.append((key, rows))
    return sections


def render_doctor(snap: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for title, rows in doctor_rows(snap):
        t = Table(title=title, show_header=False, title_justify="left")
        t.add_column("field", style="bold")
        t.add_column("value")
        for k, v in rows:
            t.add_row(k, v)
        console.print(t)
