"""Surveys: head statistics over a whole image set (``headscope survey``, ``headscope report``).

sources.py (what to read) -> compute.py (the model and the rows, shared by both engines) ->
local.py / ray_engine.py (the engines) -> output.py (Parquet parts, resume) ; run.py ties them
together; schema.py names the columns; report.py draws the HTML page.
"""
