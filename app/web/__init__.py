"""HTTP: ``create_app`` (main.py), middleware, errors, schemas and the thin routers in ``api/``."""
