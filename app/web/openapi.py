"""The OpenAPI document, with JSON Schema's names for every parameter's bounds.

Pydantic cannot push ``ge``/``le`` into a type that has a validator of its own (``Int`` and
``Float`` in :mod:`app.serving.params`, which take ASCII digits only), so their bounds reached
the schema under pydantic's names, which Swagger UI and client generators ignore.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

# pydantic's constraint -> JSON Schema's keyword (OpenAPI 3.1)
BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def standard_bounds(node: Any) -> Any:
    """Rename pydantic's bound names to JSON Schema's in every number schema below ``node``, in place."""
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for ours, theirs in BOUNDS.items():
                if ours in node:
                    node.setdefault(theirs, node.pop(ours))
        for value in node.values():
            standard_bounds(value)
    elif isinstance(node, list):
        for value in node:
            standard_bounds(value)
    return node


def install(app: FastAPI) -> None:
    """Serve ``app``'s OpenAPI document with :func:`standard_bounds` applied (built once, as FastAPI does)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            standard_bounds(build())
        return app.openapi_schema  # type: ignore[return-value]  # build() has set it

    app.openapi = openapi  # type: ignore[method-assign]
