"""Shape arithmetic that PyTorch does, done without PyTorch: broadcasting and matmul."""

from app.catalog.model import CatalogError


def broadcast(a: tuple[int, ...], b: tuple[int, ...], field: str) -> tuple[int, ...]:
    out: list[int] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise CatalogError(
                field, f"shapes {list(a)} and {list(b)} do not broadcast (dim -{i}: {x} vs {y})"
            )
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], field: str) -> tuple[int, ...]:
    """The output shape of ``torch.matmul(a, b)``, with its rules for 1-D operands."""
    if not a or not b:
        raise CatalogError(field, "matmul needs operands with at least 1 dim")
    if len(a) == 1 and len(b) == 1:
        if a[0] != b[0]:
            raise CatalogError(field, f"vector lengths differ: {a[0]} vs {b[0]}")
        return ()
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise CatalogError(
            field,
            f"inner dims differ: shape {list(a)} @ other_shape {list(b)} ({a2[-1]} vs {b2[-2]})",
        )
    batch = broadcast(a2[:-2], b2[:-2], field)
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = (*out[:-2], out[-1])
    if len(b) == 1:
        out = out[:-1]
    return out
