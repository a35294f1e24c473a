"""`python -m hvd_torch.runner ...` is `hvdrun ...` (and `python -m hvdrun ...`)."""

import sys

from hvdrun.launch import main

sys.exit(main())
