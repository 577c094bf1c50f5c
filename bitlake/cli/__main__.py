"""``python -m bitlake.cli``: the ``bitlake`` command."""

import sys

from bitlake.cli import main

sys.exit(main())
