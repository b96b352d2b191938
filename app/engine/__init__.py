"""The model computation: token layout, the capture hooks, selection, analysis and statistics.

Nothing here knows about HTTP or queues; everything takes tensors and a :class:`TokenLayout`.
"""
