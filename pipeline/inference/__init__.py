"""The infer stage: the rows of a submission (`rows`), span predictions on the session's devices
(`predict`, `inference_devices`), the CPU engines (`engines`) and the submission itself (`submission`).

Imports core and devices, never training (tests/test_layers.py checks it). Import the submodules directly.
"""
