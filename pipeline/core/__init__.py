"""The shared ML data flow, what training and inference both compute: configuration (`config`), tables
(`tables`), audio (`data`), the model (`model`, `buckets`), windows and their pooling (`windows`), objectives
and metrics, the artifact (`artifact`), its ONNX files (`onnx`), staged writes (`staging`), progress and the
reports (`progress`, `report`), Kaggle's session facts (`kaggle`).

The bottom layer: it imports nothing else of `pipeline` (tests/test_layers.py checks it). Import the
submodules directly; this package imports nothing.
"""
