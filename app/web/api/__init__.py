"""Thin routers: parse HTTP, call the service, shape the answer."""
