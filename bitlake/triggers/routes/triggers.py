"""``/triggers``: partition and snapshot triggers evaluated for consumers, and a flow's cursor acknowledged."""

from typing import TypeVar

from fastapi import APIRouter
from fastapi.responses import Response

from bitlake.triggers.routes.deps import Calls, Consumer, MaxPage, in_scope, page_limit
from bitlake.triggers.routes.responses import json_response
from bitlake.triggers.trigger import (
    FlowCursor,
    PartitionTrigger,
    PartitionTriggerResult,
    SnapshotAck,
    SnapshotTrigger,
    SnapshotTriggerResult,
)

T = TypeVar("T", PartitionTrigger, SnapshotTrigger)

router = APIRouter(prefix="/triggers", tags=["triggers"])


def _limited(trigger: T, max_page: int) -> T:
    """``trigger`` with its ``limit`` within the service's page size (a default over it lowered to it)."""
    limit = page_limit(trigger.limit, max_page, given="limit" in trigger.model_fields_set)
    return trigger if limit == trigger.limit else trigger.model_copy(update={"limit": limit})


@router.post("/partition", response_model=PartitionTriggerResult)
async def partition_trigger(trigger: PartitionTrigger, info: Consumer, calls: Calls, max_page: MaxPage
                            ) -> Response:
    """Has the partition (templates rendered at the scheduled time) arrived by the evaluation time?"""
    in_scope(info, trigger.table)
    trigger = _limited(trigger, max_page)
    return json_response(await calls(lambda s: s.evaluate_partition_trigger_json(trigger)))


@router.post("/snapshot", response_model=SnapshotTriggerResult)
async def snapshot_trigger(trigger: SnapshotTrigger, info: Consumer, calls: Calls, max_page: MaxPage
                           ) -> Response:
    """The flow's events after its last acknowledged one; does not move the cursor."""
    in_scope(info, trigger.table)
    trigger = _limited(trigger, max_page)
    return json_response(await calls(lambda s: s.evaluate_snapshot_trigger_json(trigger)))


@router.post("/snapshot/ack", response_model=FlowCursor)
async def snapshot_ack(ack: SnapshotAck, info: Consumer, calls: Calls) -> Response:
    """Move the flow's cursor to event_id after a successful run; repeating it is a no-op, going back a 409."""
    in_scope(info, ack.table)
    return json_response(await calls(lambda s: s.ack(ack.flow, ack.table, ack.event_id)))
