"""The one error shape every failing response has."""

from typing import Any

from pydantic import BaseModel, Field


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
