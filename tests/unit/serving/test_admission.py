"""Admission: pools of slots refused at once when full, tickets, the decode budget, large answers."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import pytest

from headscope.serving.admission import (
    FOLLOW_UP,
    HEAVY,
    PRIORITY,
    UPLOAD,
    Admission,
    QueueFullError,
    TooLargeToDecode,
    current_ticket,
)
from headscope.serving.metrics import Metrics


def test_admission_refuses_at_once_when_every_slot_is_taken_and_frees_slots_on_error():
    adm = Admission(2, Metrics())
    with adm.slot(), adm.slot():
        assert adm.full
        with pytest.raises(QueueFullError), adm.slot():
            pass
    with pytest.raises(ValueError), adm.slot():
        raise ValueError("the request failed")
    assert adm.in_use == 0 and not adm.full
    assert adm.metrics.rejections.labels("queue_full")._value.get() == 1


# -- pools, tickets, the decode budget, large answers (app/serving/admission.py) ----------------
def test_each_class_has_its_own_pool_so_follow_ups_do_not_use_up_upload_slots():
    adm = Admission(2, Metrics(), follow_ups=3, heavy=1)
    with ExitStack() as held:
        for _ in range(3):
            held.enter_context(adm.admit(FOLLOW_UP))
        with pytest.raises(QueueFullError):
            held.enter_context(adm.admit(FOLLOW_UP))
        with adm.admit(UPLOAD) as t, adm.admit(HEAVY):  # still free
            assert t.cls == UPLOAD and t.priority < PRIORITY[FOLLOW_UP] < PRIORITY[HEAVY]
            with pytest.raises(QueueFullError), adm.admit(HEAVY):
                pass
    assert all(p.in_use == 0 for p in adm.pools.values())
    assert adm.metrics.rejections.labels("follow_ups_full")._value.get() == 1
    assert adm.metrics.rejections.labels("heavy_full")._value.get() == 1


def test_a_ticket_is_current_inside_its_request_and_carries_the_deadline():
    adm = Admission(2, Metrics(), timeout_s=30)
    assert current_ticket() is None
    with adm.admit(FOLLOW_UP) as t:
        assert current_ticket() is t and 29 < t.remaining() <= 30
    assert current_ticket() is None


def test_large_answers_hold_a_slot_until_the_request_ends():
    adm = Admission(4, Metrics(), large_answers=1, large_answer_bytes=1000)
    with adm.admit(UPLOAD):
        adm.large_answer(999)  # small: no slot
        adm.large_answer(1000)
        assert adm.large.in_use == 1
        with adm.admit(UPLOAD), pytest.raises(QueueFullError):
            adm.large_answer(5000)
    assert adm.large.in_use == 0
    adm.large_answer(10**9)  # outside a request (command line): nothing to hold
    assert adm.large.in_use == 0


def test_decode_budget_refuses_a_picture_over_it_and_one_that_does_not_fit_beside_the_running_ones():
    adm = Admission(4, Metrics(), decode_budget_bytes=100, decodes=2)

    async def go():
        with pytest.raises(TooLargeToDecode):
            async with adm.decoding(101):
                pass
        async with adm.decoding(60):
            assert adm.decode.reserved == 60
            # The second decode thread is free, and 41 does not fit beside the 60 running: 429.
            with pytest.raises(QueueFullError):
                async with adm.decoding(41):
                    pass
            assert adm.decode.reserved == 60
            async with adm.decoding(40):
                assert adm.decode.reserved == 100
                # Both threads are taken: the next ones wait their turn holding nothing of the
                # budget (they were refused when the waiting held reservations too).
                waiting = [asyncio.create_task(_hold(adm, 30)) for _ in range(3)]
                await asyncio.sleep(0.05)
                assert adm.decode.reserved == 100 and not any(t.done() for t in waiting)
        await asyncio.gather(*waiting)  # each got its turn and fitted
        assert adm.decode.reserved == 0

    asyncio.run(go())
    assert adm.metrics.rejections.labels("decode_busy")._value.get() == 1
    assert adm.metrics.rejections.labels("decode_too_large")._value.get() == 1


async def _hold(adm, n):
    async with adm.decoding(n):
        pass


def test_one_client_holds_at_most_its_share_of_a_pool():
    """#39 items 2 and 3: a client address takes at most its share; others still get slots, and
    a refused or finished request gives its share back."""
    adm = Admission(8, Metrics(), heavy=4, per_client={UPLOAD: 2, HEAVY: 1})
    with ExitStack() as held:
        held.enter_context(adm.admit(UPLOAD, client="10.0.0.1"))
        held.enter_context(adm.admit(UPLOAD, client="10.0.0.1"))
        with pytest.raises(QueueFullError, match="this client already has 2 upload"):
            held.enter_context(adm.admit(UPLOAD, client="10.0.0.1"))
        held.enter_context(adm.admit(UPLOAD, client="10.0.0.2"))  # another client
        held.enter_context(adm.admit(HEAVY, client="10.0.0.1"))  # another pool, its own share
        with pytest.raises(QueueFullError):
            held.enter_context(adm.admit(HEAVY, client="10.0.0.1"))
        held.enter_context(adm.admit(FOLLOW_UP, client="10.0.0.1"))  # no share: the whole pool
        held.enter_context(adm.admit(FOLLOW_UP, client="10.0.0.1"))
        assert adm.in_use == 3
    with adm.admit(UPLOAD, client="10.0.0.1"), adm.admit(UPLOAD, client="10.0.0.1"):
        assert current_ticket().client == "10.0.0.1"
    assert adm.in_use == 0
