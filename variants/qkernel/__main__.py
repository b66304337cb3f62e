"""``python -m variants.qkernel [--force]``: build the quantized CPU kernel (see the package)."""

import sys

from variants.qkernel import main

sys.exit(main())
