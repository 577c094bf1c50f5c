"""How the routes answer: JSON serialised once, and input echoed in an error only once made encodable."""

from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel, ValidationError


def json_response(body: BaseModel | bytes) -> Response:
    """``body`` as the response, JSON serialised once: by pydantic, or already by the store.

    Returning a model would make FastAPI validate it again against the response model and then serialise
    it; the store's ``*_json`` methods go further and have the database write the JSON of the events they
    return, so no Python object is built per event. The routes keep ``response_model`` for the OpenAPI spec.
    """
    return Response(body if isinstance(body, bytes) else body.model_dump_json(), media_type="application/json")


def printable(value: Any) -> Any:
    """``value`` with every string made encodable: a lone surrogate in the input must not turn a 422 into a 500."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    return value


def reasons(error: ValidationError) -> str:
    """The errors of ``error`` on one line: ``location: message`` each."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors())
