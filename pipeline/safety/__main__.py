"""`python -m pipeline.safety NOTEBOOK` is `python -m pipeline check-safety NOTEBOOK`."""

import sys

from .check import main

sys.exit(main())
