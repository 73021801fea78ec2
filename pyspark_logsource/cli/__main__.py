"""``python -m pyspark_logsource.cli``: the ``plog`` command."""

import sys

from pyspark_logsource.cli.app import main

sys.exit(main())
