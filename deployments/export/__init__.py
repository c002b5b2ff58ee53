"""Checkpoint -> servable model directory (ONNX graph + tokenizer + manifest), per model family.

CLI: `python -m deployments.export {glm,kimi,embedding,moderation,defaults} ...`
"""
