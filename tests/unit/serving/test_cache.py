"""The byte-bounded LRU that keeps captures and encoded answers."""

from __future__ import annotations

from headscope.serving.cache import ByteLRU


def test_byte_lru_evicts_least_recent():
    c = ByteLRU(100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3, 40)
    assert c.get("b") is None and c.get("a") == 1 and c.nbytes == 80
    assert not c.put("huge", 0, 101) and c.get("huge") is None


def test_byte_lru_charges_a_shared_buffer_once_and_frees_it_with_its_last_user():
    c = ByteLRU(250)
    c.put("a", 1, 10, shared={"batch": 100})
    c.put("b", 2, 10, shared={"batch": 100})  # a batch-mate: same buffer
    assert c.nbytes == 120
    c.put("c", 3, 10, shared={"other": 100})
    assert c.nbytes == 230
    # 280 > 250: evicting a frees only its own 10 bytes (b still uses the batch), so b goes too
    c.put("d", 4, 50)
    assert c.get("a") is None and c.get("b") is None and c.nbytes == 160 and len(c) == 2
    c.put("c", 3, 10, shared={"other": 100})  # replacing a value does not charge twice
    assert c.nbytes == 160
    assert c.evict_where(lambda v: v == 3) == 110 and c.nbytes == 50 and len(c) == 1
    assert not c.put("e", 5, 10, shared={"x": 250}) and c.nbytes == 50
