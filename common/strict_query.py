"""Refuse query parameters a route does not declare.

FastAPI ignores unknown query parameters; a client that misspells one (`?limt=5`) would then get
an answer to a question it did not ask. Every service adds this as an app-wide dependency, so an
undeclared name is a 422 before the handler runs.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute


def _declared(route: APIRoute) -> set[str]:
    names: set[str] = set()
    pending = [route.dependant]
    while pending:  # the route's own parameters and those of its dependencies
        dependant = pending.pop()
        names.update(p.alias for p in dependant.query_params)
        pending.extend(dependant.dependencies)
    return names


async def reject_unknown_query(request: Request) -> None:
    """App-wide dependency: 422 for a query parameter the matched route does not declare."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    unknown = sorted(set(request.query_params) - _declared(route))
    if unknown:
        # A validation error like any other, so each service answers it in its own 422 shape.
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "msg": "unknown query parameter",
                }
                for name in unknown[:20]
            ]
        )
