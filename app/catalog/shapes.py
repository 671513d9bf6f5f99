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


def norm_dim(dim: int, ndim: int, field: str) -> int:
    """A dim index as PyTorch reads it (negative counts from the end), checked."""
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise CatalogError(field, f"dim {dim} is out of range for a {ndim}-D tensor")
    return dim % max(ndim, 1)


def conv2d_shape(
    shape: tuple[int, ...], out_channels: int, kernel: int, stride: int, padding: int, groups: int
) -> tuple[int, ...]:
    if len(shape) != 4:
        raise CatalogError("shape", "conv2d takes [N, C, H, W]")
    n, c, h, w = shape
    if c % groups or out_channels % groups:
        raise CatalogError(
            "params.groups", f"in channels {c} and out_channels {out_channels} must divide by it"
        )
    oh, ow = ((d + 2 * padding - kernel) // stride + 1 for d in (h, w))
    if oh < 1 or ow < 1:
        raise CatalogError("params.kernel_size", f"kernel {kernel} is larger than the input")
    return (n, out_channels, oh, ow)


def einsum_shape(equation: str, operands: list[tuple[int, ...]], field: str) -> tuple[int, ...]:
    """The output shape of ``torch.einsum(equation, *operands)`` for explicit equations."""
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise CatalogError(field, f"{equation!r} takes {len(terms)} operand(s)")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, operands, strict=True):
        if len(term) != len(shape):
            raise CatalogError(
                field, f"term {term!r} needs a {len(term)}-D operand, not {list(shape)}"
            )
        for letter, size in zip(term, shape, strict=True):
            if sizes.setdefault(letter, size) != size:
                raise CatalogError(
                    field, f"index {letter!r} is {sizes[letter]} in one place and {size} in another"
                )
    return tuple(sizes[letter] for letter in rhs)
