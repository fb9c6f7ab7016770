"""The infer stage, `submission.run_inference`: the rows of a submission (`rows`), every hardware choice decided
once (`runtime`), the engines that embed a batch (`engines`), span predictions (`predict`), chunk
post-processing (`postprocess`) and the writer (`submission`).

Imports core and devices, never training (tests/test_layers.py checks it). Import the submodules directly.
"""
