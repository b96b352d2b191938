"""The progress of importance and pruning for a windowed model is refused whether or not the
model has loaded yet (it was 200 `idle` before the first load, 422 after)."""

from __future__ import annotations

import pytest

from headscope.config import Settings
from headscope.engine.ablation import AblationUnsupportedError
from headscope.serving.ablation import AblationService
from headscope.serving.admission import Admission
from headscope.serving.cache import ByteLRU
from headscope.serving.metrics import Metrics
from headscope.serving.uploads import Uploads
from headscope.zoo.registry import Registry

SWIN = "random:swin_tiny_patch4_window7_224"


def test_a_windowed_models_progress_is_refused_before_it_loads(tmp_path):
    settings = Settings()
    registry = Registry(["random:test_vit", SWIN], tmp_path)
    cache = ByteLRU(1 << 20)
    uploads = Uploads(settings, cache, Admission.from_settings(settings, Metrics(), "cpu"))
    service = AblationService(settings, uploads, None, cache, registry)
    assert registry.windowed(SWIN) and not registry.windowed("random:test_vit")
    for what in ("importance", "pruning"):
        with pytest.raises(AblationUnsupportedError):
            service.progress(what, "a" * 24, SWIN, "ablation")
    assert not registry.is_loaded(SWIN)  # answered from the name: nothing was loaded to say it
