import sys

from variants.cli import main

sys.exit(main())
