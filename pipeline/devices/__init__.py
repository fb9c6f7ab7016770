"""Device topology probes (`probe`) and the multi-process launcher (`launch`).

Import the submodules directly; this package imports nothing so that a probe never drags in torch_xla.
"""
