"""The train stage: training data and its audio cache (`dataset`, `store`, `augment`, `batches`), the loop
(`train`), validation, the weight average, checkpoints, provenance, the pretrained start and the artifact's
ONNX files (`onnx_artifact`).

Imports core and devices, never inference (tests/test_layers.py checks it). Import the submodules directly.
"""
