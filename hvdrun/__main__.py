"""`python -m hvdrun -np 2 python train.py` is the same as `hvdrun ...`."""

import sys

from .launch import main

sys.exit(main())
