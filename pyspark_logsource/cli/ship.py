"""``plog ship``: write the zip of plog's packages that a cluster's executors import (``spark.submit.pyFiles``).

Executors on YARN or Kubernetes run a Python of their own; the zip gives them plog without installing it
there (its third-party dependencies must be installed there). See ``pyspark_logsource.spark.shipping``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pyspark_logsource.cli.common import EXIT_OK, ROOT_UNUSED, Env
from pyspark_logsource.spark.shipping import build_pyfiles_zip, shipping_conf

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog ship`` to ``commands`` (it takes no root: ``common`` is not its parent)."""
    ship = commands.add_parser(
        "ship",
        help="write a zip of plog's packages for spark.submit.pyFiles (executors without plog installed)",
        description="Write pyspark_logsource-<version>-<hash>.zip (plog's three packages, as this Python "
        "imports them) and print its path, then the spark-submit settings that ship it: spark.submit.pyFiles, "
        "spark.executorEnv.PYTHONPATH naming the zip, spark.sql.execution.pyspark.python naming the executors' "
        "Python, which needs plog's dependencies (pyarrow, numpy, pandas, fsspec, lz4, google-crc32c, rich).",
    )
    ship.add_argument("-d", "--directory", default="dist", help="where to write the zip (default: ./dist)")
    ship.set_defaults(handler=cmd_ship, root=ROOT_UNUSED)


def cmd_ship(env: Env) -> int:
    """``plog ship [-d DIR]``: write the zip and print its path alone on stdout (for ``$(plog ship)``)."""
    path = build_pyfiles_zip(env.args.directory)
    env.out.print(str(path), soft_wrap=True, highlight=False)
    conf = " ".join(f"--conf {k}={v}" for k, v in shipping_conf(path, "<executors' python>").items())
    env.note(f"then: spark-submit {conf} ...  (shipping_conf() in pyspark_logsource.spark.shipping gives the same)")
    return EXIT_OK
