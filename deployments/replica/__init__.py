"""The model replica processes: one Ray Serve deployment class per task on a shared base
(`base.py`), region drills at the replica (`faults.py`), and the engine they run (`engine/`:
ONNX Runtime sessions, the LLM engine, sampling, grammars, tokenizers; no Ray)."""
