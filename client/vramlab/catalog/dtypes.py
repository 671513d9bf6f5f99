"""The dtypes vramlab knows, by their PyTorch names, with their sizes in bytes."""

DTYPES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

FLOATING_DTYPES: tuple[str, ...] = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
)
COMPLEX_DTYPES: tuple[str, ...] = ("complex128", "complex64")


def itemsize(dtype: str) -> int:
    return DTYPES[dtype]


# The values each dtype holds: torch.full refuses a fill value outside them ("value
# cannot be converted to type ... without overflow").
_FLOAT_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
    "complex128": 1.7976931348623157e308,
    "complex64": 3.4028234663852886e38,
}
_INT_RANGE = {
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int8": (-128, 127),
    "uint8": (0, 255),
}


def fill_problem(value: float, dtype: str) -> str | None:
    """Why ``dtype`` cannot hold the fill ``value``, or None if it can."""
    if dtype in _FLOAT_MAX:
        top = _FLOAT_MAX[dtype]
        return None if -top <= value <= top else f"{dtype} holds at most ±{top:g}"
    if dtype in _INT_RANGE:
        low, high = _INT_RANGE[dtype]
        return None if low <= value <= high else f"{dtype} holds {low} to {high}"
    return None
