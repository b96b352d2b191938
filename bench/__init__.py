"""Headscope benchmark: ``python -m bench.run`` (``make bench``); ``--smoke`` for CI.

Measures in one run, interleaved round-robin so drift hits every variant alike:

* the bare model forward (fp32, and bf16 autocast where the CPU supports it): the reference;
* Headscope's capture (CLS rows of every layer and head; full maps);
* the peers a user would pick instead, on the same weights: timm's ``AttentionExtract`` and
  Hugging Face ``Dinov2Model`` (eager, ``output_attentions=True``);
* JSON / safetensors encoding of the answers;
* the end-to-end REST API through a real server at several concurrency levels;
* peak resident memory of the bench process and of the server.

Every throughput is also printed as a ratio to the bare fp32 forward of the same run; the
issue's targets are checked at the end (PASS/MISS). Results go to ``bench/results/latest.json``.
"""
