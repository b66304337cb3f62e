"""``python -m variants.runtime.qkernel [--force]``: build the quantized CPU kernel (see the package)."""

import sys

from variants.runtime.qkernel import main

sys.exit(main())
