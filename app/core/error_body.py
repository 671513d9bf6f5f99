"""The one error shape every failing response has."""

import json
from typing import Any

from pydantic import BaseModel, Field
from starlette.types import Send


class FieldProblem(BaseModel):
    field: str
    message: str
    prediction: dict[str, Any] | None = Field(
        default=None,
        description="a model spec refused for its predicted size: the prediction (peak, "
        "categories, predicted_for: the device it is for) and the plan that asks the same "
        "question of a GPU without running it",
    )


class ErrorBody(BaseModel):
    type: str
    message: str
    details: list[FieldProblem] | dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


async def send_error(
    send: Send, status: int, type: str, message: str, details: list[dict[str, str]] | None = None
) -> None:
    """Answer with the one error shape from ASGI middleware, below FastAPI's handlers (a
    body too large, a URL holding a NUL)."""
    error: dict[str, Any] = {"type": type, "message": message}
    if details is not None:
        error["details"] = details
    body = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
