"""Headscope: what every attention head of a Vision Transformer looks at.

The data path, one sub-package per stage:

* :mod:`app.web` - HTTP: the app factory, middleware, routers, schemas and the one error shape;
* :mod:`app.serving` - the request path: decode, admission, cache, the batching worker, encoders;
* :mod:`app.engine` - the model computation: token layout, capture hooks, selection, analysis, stats;
* :mod:`app.zoo` - model ids and sources, loaders, weight files, position tables, the embedded model.
"""

__version__ = "0.2.0"
