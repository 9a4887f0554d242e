"""Garbage-collector settings of the stream worker.

A batch allocates tens of thousands of short-lived objects (decoded samples), which trigger the
collector often, and a full collection walks every object of the process, Faust's and the agents'
included. Measured on the stream-stage benchmark: GC took ~20 % of the worker's processing time.
Freezing what start-up created moves it out of the collector's sight (CPython's ``gc.freeze``,
meant for exactly this), and a larger first-generation threshold collects once per few thousand
allocations instead of every 700. Reference counting still frees acyclic garbage at once; only
cycles wait a little longer.

The threshold counts objects allocated and not yet freed. Between batches the worker holds a batch
being filled (Faust's event, message and headers per record, up to ``stream.batch_size`` records:
tens of thousands of objects) and the changelog messages waiting to be sent; they are all freed after their
batch. At 10,000 every batch was walked by 12-15 young and a few middle-generation collections
(0.14-0.27 s in a 30-round run of the fleet bench, 640k samples); at 50,000 a batch is mostly freed before a
collection comes (2-3 young collections a run), ~0.2-0.3 µs a sample less.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Call once, after start-up has built the long-lived objects (app, agents, handlers)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
