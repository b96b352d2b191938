"""The byte-bounded LRU that keeps captures and encoded answers."""

from __future__ import annotations

from dataclasses import dataclass

from headscope.serving.cache import ByteLRU, CaptureKey, ImageKey, OutputKey


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


def test_variants_of_one_image_evict_each_other_before_anything_else():
    c = ByteLRU(1000, max_variant_bytes=250)
    c.put(ImageKey("other"), "other upload", 100)
    c.put(CaptureKey("other", "m"), "other capture", 100)
    c.put(CaptureKey("img", "m"), "plain", 100)  # no heads removed: not a variant
    for i in range(6):  # six ablated captures of one image, under two models
        c.put(CaptureKey("img", "m" if i % 2 else "n", ((0, i),)), f"ablated {i}", 100)
    assert c.get(ImageKey("other")) == "other upload" and c.get(CaptureKey("other", "m")) == "other capture"
    assert c.get(CaptureKey("img", "m")) == "plain"
    kept = [i for i in range(6) if c.get(CaptureKey("img", "m" if i % 2 else "n", ((0, i),))) is not None]
    assert kept == [4, 5] and len(c) == 5 and c.nbytes == 500
    # Outputs are a group of their own; a read makes a variant the most recent of its group.
    c.put(OutputKey("img", "m", ((1, 1),)), "out 1", 100)
    c.put(OutputKey("img", "m", ((1, 2),)), "out 2", 100)
    assert c.get(OutputKey("img", "m", ((1, 1),))) == "out 1"
    c.put(OutputKey("img", "m", ((1, 3),)), "out 3", 100)
    assert c.get(OutputKey("img", "m", ((1, 2),))) is None and c.get(OutputKey("img", "m", ((1, 1),))) == "out 1"
    assert c.get(CaptureKey("img", "m", ((0, 5),))) == "ablated 5"  # the captures' group is untouched
    assert c.get(OutputKey("img", "m")) is None and c.put(OutputKey("img", "m"), "plain out", 100)


def test_a_variant_is_charged_its_shared_buffers_and_the_newest_always_stays():
    c = ByteLRU(1000, max_variant_bytes=250)
    c.put(CaptureKey("img", "m", ((0, 0),)), "a", 10, shared={"batch a": 100})
    c.put(CaptureKey("img", "m", ((0, 1),)), "b", 10, shared={"batch b": 100})
    assert len(c) == 2 and c.nbytes == 220
    c.put(CaptureKey("img", "m", ((0, 2),)), "c", 10, shared={"batch c": 100})  # 330 > 250: a goes
    assert c.get(CaptureKey("img", "m", ((0, 0),))) is None and c.nbytes == 220
    c.put(CaptureKey("img", "m", ((0, 3),)), "big", 400)  # over the bound alone: kept, the rest goes
    assert len(c) == 1 and c.get(CaptureKey("img", "m", ((0, 3),))) == "big" and c.nbytes == 400
    # Statistics memoised later grow a variant: its group is trimmed again (the grown one stays).
    c.put(CaptureKey("img", "m", ((0, 4),)), "d", 10)
    assert len(c) == 1  # big + d = 410 > 250: big, the least recently used, went
    c.put(CaptureKey("img", "m", ((0, 5),)), "e", 10)
    assert c.recharge(CaptureKey("img", "m", ((0, 4),)), 245)
    assert c.get(CaptureKey("img", "m", ((0, 5),))) is None and c.get(CaptureKey("img", "m", ((0, 4),))) == "d"


def test_a_variant_evicted_for_bytes_leaves_its_group():
    c = ByteLRU(400, max_variant_bytes=100)
    c.put(CaptureKey("img", "m", ((0, 0),)), "a", 50)
    c.put(CaptureKey("img", "m", ((0, 1),)), "b", 50)
    c.put("x", "x", 360)  # evicts both variants by bytes
    assert len(c) == 1
    c.put(CaptureKey("img", "m", ((0, 2),)), "c", 20)
    c.put(CaptureKey("img", "m", ((0, 3),)), "d", 20)
    assert c.get(CaptureKey("img", "m", ((0, 2),))) == "c" and c.get("x") == "x"  # the group counted anew
    c.put(CaptureKey("img", "m", ((0, 2),)), "c again", 20)  # replacing a value does not count twice
    assert c.get(CaptureKey("img", "m", ((0, 3),))) == "d" and len(c) == 3


def test_any_key_with_an_image_and_heads_removed_is_a_variant():
    """A key type added later (relevance maps, say) is bounded per image by naming its fields."""

    @dataclass(frozen=True)
    class LaterKey:
        image_id: str
        ablate: tuple[tuple[int, int], ...]
        target: str

    c = ByteLRU(1000, max_variant_bytes=250)
    c.put(ImageKey("other"), "other upload", 100)
    for i in range(5):
        c.put(LaterKey("img", ((0, i),), "output"), i, 100)
    c.put(LaterKey("img", (), "output"), "plain", 100)  # no heads removed: not a variant
    assert [i for i in range(5) if c.get(LaterKey("img", ((0, i),), "output")) is not None] == [3, 4]
    assert c.get(ImageKey("other")) == "other upload" and c.get(LaterKey("img", (), "output")) == "plain"
    c.put(CaptureKey("img", "m", ((0, 0),)), "capture", 200)  # another key type: a group of its own
    assert c.get(LaterKey("img", ((0, 4),), "output")) == 4
