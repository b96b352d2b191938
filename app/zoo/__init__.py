"""Models: ids and sources (ids.py), loaders, weight files, position tables, the embedded model,
and the :class:`~app.zoo.registry.Registry` that builds them lazily."""
