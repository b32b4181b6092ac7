"""``python -m senddock`` is the ``senddock`` command."""

import sys

from senddock.cli import main

sys.exit(main())
