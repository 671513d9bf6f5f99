"""Transfers: host to device, device to host, device to device, pageable or pinned."""

from app.catalog.families.common import ALL, Params, Shape
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec

NUMPY_DTYPES = (
    "float64",
    "float32",
    "float16",
    "complex128",
    "complex64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


def _to(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    source = params["source_device"]
    source_dtype = params["source_dtype"] or dtype
    if params["pin_memory"] and source != "cpu":
        raise CatalogError("params.pin_memory", "only a tensor on the CPU can be pinned")
    if params["source_kind"] == "numpy":
        if source != "cpu":
            raise CatalogError("params.source_kind", "a NumPy array lives on the CPU")
        if source_dtype not in NUMPY_DTYPES:
            raise CatalogError(
                "params.source_dtype",
                f"NumPy has no {source_dtype}; it has {', '.join(NUMPY_DTYPES)}",
            )
    src = TensorSpec("source", shape, source_dtype, source)
    # Tensor.to returns the source itself when nothing changes, unless copy=True.
    same = source == device and source_dtype == dtype and not params["copy"]
    outputs = () if same else (TensorSpec("out", shape, dtype, device),)
    extra = ("cuda:0",) if params["pin_memory"] and device == "cpu" else ()
    caveats: tuple[str, ...] = ()
    if source == "cpu" and device != "cpu" and not params["pin_memory"]:
        caveats = (
            "the driver's pinned staging buffers for a pageable copy are host memory "
            "outside PyTorch's counters: see host RSS",
        )
    if params["source_kind"] == "numpy":
        caveats = (*caveats, "NumPy allocates the source: on the CPU PyTorch's figures miss it")
    return TensorPlan(inputs=(src,), outputs=outputs, extra_devices=extra, caveats=caveats)


ENTRIES = (
    OpEntry(
        name="to",
        summary="tensor.to(device, dtype): a copy between devices or dtypes; the source "
        "stays alive, so both copies are held afterwards",
        plan_fn=_to,
        params=(
            Param("source_device", "device", "where the source tensor is made", default="cpu"),
            Param("source_dtype", "dtype", "dtype of the source tensor (default: dtype)"),
            Param(
                "source_kind",
                "choice",
                "make the source with torch, or as a NumPy array "
                "(row-major, np.ones) wrapped by torch.from_numpy",
                default="torch",
                choices=("torch", "numpy"),
            ),
            Param("pin_memory", "bool", "pin the source in page-locked host memory", default=False),
            Param("non_blocking", "bool", "asynchronous copy (pinned memory only)", default=False),
            Param("copy", "bool", "copy even when nothing would change", default=False),
        ),
        dtypes=ALL,
        tags=("transfer",),
    ),
)
