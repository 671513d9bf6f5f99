"""The client's failures: one class for what the API refused, and the few the client
decides itself. Each says what went wrong in one line (the CLI prints it, exit 1)."""

from typing import Any

import httpx


class ClientError(Exception):
    """A failure to report in one line."""


class ApiError(ClientError):
    """The API answered with an error: its status code and the API's one error shape,
    ``{"error": {"type", "message"}}`` (``type`` is ``None`` when the answer did not have
    that shape, such as a proxy's page)."""

    def __init__(
        self, status_code: int, type: str | None, message: str, details: Any = None
    ) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.type = type
        self.message = message
        self.details = details  # the fields at fault, as the API listed them

    @classmethod
    def of(cls, response: httpx.Response) -> "ApiError":
        try:
            error = response.json()["error"]
            return cls(
                response.status_code,
                error.get("type"),
                str(error["message"]),
                error.get("details"),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(response.status_code, None, response.text[:500])

    @property
    def prediction(self) -> dict[str, Any] | None:
        """A model spec refused for its predicted size: the prediction its 422 carried."""
        for detail in self.details if isinstance(self.details, list) else []:
            if isinstance(detail, dict) and isinstance(detail.get("prediction"), dict):
                found: dict[str, Any] = detail["prediction"]
                return found
        return None


class GaveUp(ClientError):
    """Waiting stopped: no live worker can run the experiment."""


def checked(response: httpx.Response) -> Any:
    """The JSON of a successful answer (``None`` if it has none); else raise ApiError."""
    if response.is_success:
        return response.json() if "json" in response.headers.get("content-type", "") else None
    raise ApiError.of(response)
