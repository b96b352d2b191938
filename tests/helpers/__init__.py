"""What the tests (and the benchmark) share: imported, never copied.

* :mod:`helpers.server`: a real ``headscope serve`` process on a free loopback port, the
  machine's :class:`~helpers.server.Pace`, the checkout's paths;
* :mod:`helpers.api`: the HTTP side of the API tests (``post``, ``get``, ``assert_error``,
  pictures no other test sends), with image ids computed by the app itself;
* :mod:`helpers.models`: tiny random-weight timm models of every supported family;
* :mod:`helpers.swin_reference`: Swin's windowed attention written out independently;
* :mod:`helpers.page`: driving the page in Chromium (the browser tests);
* :mod:`helpers.cli`: ``headscope`` run as a user runs it (a process of its own).

``tests/`` is on ``sys.path`` (pytest's root conftest), so tests import ``helpers.api``; the
benchmark imports ``tests.helpers.server`` from the checkout's root.
"""
