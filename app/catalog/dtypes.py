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
INTEGER_DTYPES: tuple[str, ...] = ("int64", "int32", "int16", "int8", "uint8")


def itemsize(dtype: str) -> int:
    return DTYPES[dtype]
