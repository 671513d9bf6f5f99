"""The catalog's one error: a spec it rejects, naming the field at fault."""


class CatalogError(ValueError):
    """A spec that the catalog rejects; ``field`` names the part of the spec at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
