"""The request path: upload -> decode -> cache -> queue -> batch -> encode (service.py is the map)."""
