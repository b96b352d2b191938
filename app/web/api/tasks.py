"""DELETE /api/v1/tasks/{token}: the client that started a long computation gives it up."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from ..deps import AblationDep, RelevanceDep
from ..errors import ApiError, JSONBody
from ..schemas import ERROR_RESPONSES, TaskCancelResponse

router = APIRouter(prefix="/api/v1", tags=["tasks"])

# No length or pattern: a token of another shape names no computation either, and is answered so
# (404 task_not_found, as the docs say of every unknown token), not as a malformed parameter.
TokenPath = Annotated[
    str,
    Path(description="the `cancel_token` of the 202 answer that started the computation (only its starter has it)"),
]


@router.delete(
    "/tasks/{token}",
    summary="Give up a long computation you started",
    response_model=TaskCancelResponse,
    responses={404: ERROR_RESPONSES[404], 422: ERROR_RESPONSES[422]},
)
async def delete_task(ablation: AblationDep, relevance: RelevanceDep, token: TokenPath):
    """Cancel the importance, pruning or faithfulness computation whose 202 answer gave this
    `cancel_token` (`state: cancelled`; its `…/progress` says `idle` again). A computation that
    other requests are waiting for goes on for them (`state: running`) and is cancelled once they
    have gone. The token works once; an unknown or used token, or a computation that has
    finished, is 404 `task_not_found`. Takes no admission slot and no worker time."""
    for service in (ablation, relevance):
        state = service.cancel(token)
        if state is not None:
            return JSONBody({"state": state})
    raise ApiError(404, "task_not_found", "no running computation has this cancel token (finished, or cancelled)")
