"""Admission: a fixed number of slots, refused at once when full."""

from __future__ import annotations

import pytest

from app.serving.admission import Admission, QueueFullError
from app.serving.metrics import Metrics


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
