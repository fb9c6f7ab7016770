"""The hardware layer: probes (`probe`), the hardware policy and launcher (`policy`), the multi-process
launcher (`launch`) and the strategies (`strategy`, `ddp`, `xla`).

Import the submodules directly; this package imports nothing so that a probe never drags in torch_xla.
"""

import os

# XLA's C++ logging prints a GSPMD deprecation warning per compiled graph. It reads this variable once, when
# torch_xla is imported, which only pipeline.devices.xla does: set here, it is in place for that import, in
# this process and in every process it spawns.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
