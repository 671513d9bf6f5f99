"""The one error shape every failing response has."""

from typing import Any

from pydantic import BaseModel


class FieldProblem(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    type: str
    message: str
    details: list[FieldProblem] | dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
