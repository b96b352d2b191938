"""A tiny random-weight model shared by the serving tests."""

from __future__ import annotations

import pytest

from headscope.zoo.registry import Registry


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return Registry(["random:test_vit"], tmp_path_factory.mktemp("m")).get()
