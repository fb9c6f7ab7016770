"""Static submission-safety check for the Kaggle inference notebook.

The submission notebook runs with the internet off and without torch_xla, so this module
looks (without importing or executing anything) for:

* ``xla-import``: any import of ``torch_xla``, in the notebook or in any module of the
  project's own package(s) that the notebook imports, followed transitively;
* ``pip-online``: package installs that need an index (``pip install`` without ``--no-index``,
  also through ``pip.main``/``pip._internal``; ``conda``/``apt-get install``);
* ``download``: network access (urllib, requests, httpx, torch.hub, huggingface_hub,
  ``from_pretrained``/``from_hparams``/SpeechBrain ``fetch`` with a hub id, ``datasets.load_dataset``,
  raw sockets that connect, wget/curl, ``git clone``, ``kaggle ... download``);
* ``syntax-error`` / ``unresolved``: a file that cannot be parsed, or a project module that is
  imported but cannot be found -- in both cases safety cannot be established.

Usage: ``python -m pipeline check-safety notebooks/infer.ipynb [--root DIR] [--package NAME]``.
"""

from .check import analyse, check_notebook, main
from .findings import Finding, SafetyError, SafetyReport

__all__ = ["Finding", "SafetyError", "SafetyReport", "analyse", "check_notebook", "main"]
