"""A chart as plain data: lines, vertical marks and labelled points, in bytes over x."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Line:
    name: str
    xs: list[float]
    ys: list[float]
    dashed: bool = False
    step: bool = True  # memory holds its value until the next event
    markers: bool = False


@dataclass(frozen=True)
class Mark:
    """A vertical line: a phase boundary."""

    x: float
    label: str


@dataclass(frozen=True)
class Label:
    """A labelled point: the peak, a large block."""

    x: float
    y: float
    text: str


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str = "bytes"
    lines: list[Line] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    x_log: bool = False


def human_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
