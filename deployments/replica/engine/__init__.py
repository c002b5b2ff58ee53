"""ONNX Runtime inference layer: sessions, tokenizers, sampling and the per-task runtimes.

Nothing here imports Ray, so the runtimes run (and are tested) as plain Python.
"""
