"""The local lab: an HAProxy edge in front of toy origins, and a paced traffic generator.

Used by `make run` (so there is something to see), the end-to-end tests and the benchmarks.
"""
