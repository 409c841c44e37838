"""``python -m bebop``: the ``bebop`` command (also under ``torchrun -m bebop`` / ``python -m torch.distributed.run``)."""

import sys

from bebop.cli import main

sys.exit(main())
