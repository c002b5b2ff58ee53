"""Benchmarks of the serving stack, run by `python -m benchmarks.run` (`make bench`); one module per
suite (benchmarks/<suite>.py exposing `run(args) -> dict`), never collected by pytest."""
