"""The model predictor as a service, for deployments whose API image has no torch.

``vramlab predictor`` (or ``python -m app.experiments.predictor_service``) serves
``POST /v1/predict``: one request of the predictor's protocol (``{"id", "params",
"device", "allocator", "submitter"}``) answered as ``python -m workers.models.predict``
answers it (a prediction, or ``{"error": ...}``). Behind it is the same pool the API
uses under ``vramlab up`` (app/experiments/predictor.py): children at a lower CPU
priority, a limit per prediction, turns across submitters, answers remembered. The API
reaches it through ``VRAMLAB_PREDICTOR_URL``; it scales apart from the API (one replica
serves several API processes), in the worker-cpu image, which has torch's CPU build.
With ``VRAMLAB_PREDICTOR_TOKEN`` set, a request must carry it as a bearer token.
"""

import argparse
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.core.config import Settings


def create_app(settings: "Settings") -> "FastAPI":
    # The web stack is imported here, not above: `vramlab --help` and `vramlab worker`
    # parse their arguments without it. (No `from __future__ import annotations` in this
    # module: FastAPI reads the handlers' annotations, which name these local imports.)
    from fastapi import FastAPI, Header, Request
    from fastapi.responses import JSONResponse

    from app.catalog import CatalogError
    from app.core.db import Busy
    from app.experiments.predictor import EXTRA, INTERNAL, Predictor
    from app.experiments.predictor_backends import Children

    predictor = Predictor(
        Children(settings.model_predictor_children, settings.model_predictor_nice),
        settings.model_predict_timeout_s,
        settings.model_predict_wait_s,
        settings.model_predict_per_submitter,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        predictor.close()

    app = FastAPI(title="vramlab model predictor", lifespan=lifespan, docs_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/predict")
    async def predict(
        request: Request, authorization: str | None = Header(default=None)
    ) -> JSONResponse:
        if settings.predictor_token is not None and not hmac.compare_digest(
            authorization or "", f"Bearer {settings.predictor_token}"
        ):
            return JSONResponse({"detail": "a predictor token is required"}, status_code=401)
        body: dict[str, Any] = await request.json()
        ident = body.get("id")
        try:
            answer = await predictor.apredict(
                body["params"],
                str(body.get("device") or "cuda"),
                body.get("allocator"),
                str(body.get("submitter") or INTERNAL),
                {k: body[k] for k in EXTRA if body.get(k) is not None},
            )
        except CatalogError as exc:
            return JSONResponse(
                {"id": ident, "error": {"field": exc.field, "message": exc.message}}
            )
        except Busy as exc:
            return JSONResponse(
                {"detail": str(exc)},
                status_code=503,
                headers={"Retry-After": str(exc.retry_after)},
            )
        except (KeyError, TypeError, AttributeError):
            return JSONResponse({"detail": "not a prediction request"}, status_code=400)
        if answer.edges is not None:
            return JSONResponse({"id": ident, "edges": list(answer.edges)})
        if answer.peak_allocated is None:
            message = answer.caveats[0] if answer.caveats else "not predicted"
            error = {"field": "params", "message": message, "unpredictable": True}
            return JSONResponse({"id": ident, "error": error})
        return JSONResponse(
            {
                "id": ident,
                "peak_allocated": answer.peak_allocated,
                "peak_reserved": answer.peak_reserved,
                "categories": answer.categories,
                "parameter_count": answer.parameter_count,
                "trainable_parameter_count": answer.trainable_parameter_count,
                "caveats": list(answer.caveats),
                "seconds": answer.seconds,
                **({} if answer.log is None else {"log": answer.log_ints()}),
            }
        )

    return app


def add_parser(sub: Any) -> None:
    p = sub.add_parser("predictor", help="serve the model predictor to API processes (HTTP)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core.config import get_settings

    uvicorn.run(
        create_app(get_settings()), host=args.host, port=args.port, log_level=args.log_level
    )
    return 0


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(prog="python -m app.experiments.predictor_service")
    add_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run(parser.parse_args(["predictor", *sys.argv[1:]])))
