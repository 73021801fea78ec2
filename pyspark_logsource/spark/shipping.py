"""Ship plog to a cluster's executors: one ``.zip`` of its three packages for ``spark.submit.pyFiles``.

On YARN or Kubernetes the executors run a Python of their own, not the driver's environment, and
the connector's reader and writer classes reach them pickled by reference: an executor imports
``pyspark_logsource``, ``segment_format`` and ``coordinator`` itself. plog is pure Python and reads
no package data at run time, so Python's ``zipimport`` runs it from a zip on ``sys.path``, where
Spark puts every ``.zip`` of ``spark.submit.pyFiles`` / ``SparkContext.addPyFile`` /
``spark.addArtifacts(..., pyfile=True)``. A wheel is a zip too, but Spark only adds files named
``.zip``, ``.egg`` or ``.jar`` to the workers' ``sys.path`` (a ``.whl`` is shipped and then
ignored), hence a zip of its own. plog's third-party dependencies (pyarrow, numpy, pandas, fsspec,
lz4, google-crc32c, rich) have compiled parts and are not shipped this way: they must be installed
in the executors' Python (the cluster image, or a packed environment in ``spark.archives``).

Shipping the zip is not enough for ``format("plog")``, found by Spark's own lookup of installed
``pyspark_*`` packages (as of PySpark 4.3): the functions of such a data source are not UDFs. Their
executor tasks get none of the shipped files, run the driver's Python (``PYSPARK_DRIVER_PYTHON``, else
``PYSPARK_PYTHON``, as the driver's JVM sees it) and the driver's ``PYTHONPATH``. :func:`shipping_conf`
gives the three settings that make them run the executors' Python with the zip on its path.
Registering plog from the session instead (``spark.dataSource.register``) does not do for streaming:
the driver then runs the streaming source's planner in the executors' Python, without the zip.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import tempfile
import zipfile
from pathlib import Path

from segment_format.errors import PlogError

#: The packages an executor imports: the connector and what it is built from.
PACKAGES = ("pyspark_logsource", "segment_format", "coordinator")

#: Every entry's time stamp, so that the same code always gives the same bytes (and the same name).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _package_files(package: str) -> list[tuple[str, Path]]:
    """(name in the zip, file) of every module of ``package``, from wherever this Python imports it."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if len(locations) != 1 or not Path(locations[0]).is_dir():
        where = locations or (spec.origin if spec is not None else "nowhere")
        raise PlogError(f"cannot ship package {package!r}: it is imported from {where}, not from one directory")
    top = Path(locations[0])
    files = []
    for path in sorted(top.rglob("*")):
        # Modules and the typing marker only: no __pycache__ (built for this Python, maybe not the
        # executors'), no CLI data files (the CLI never runs on an executor).
        if path.is_file() and (path.suffix == ".py" or path.name == "py.typed") and "__pycache__" not in path.parts:
            files.append((f"{package}/{path.relative_to(top).as_posix()}", path))
    return files


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pyspark-logsource")
    except Exception:  # noqa: BLE001 - a checkout on sys.path only: no distribution metadata
        return "0+unknown"


def build_pyfiles_zip(directory: str | os.PathLike[str] = ".") -> Path:
    """Write plog's three packages, as this Python imports them, to a zip in ``directory``; return its path.

    The zip is named ``pyspark_logsource-<version>-<content hash>.zip``: the same code always gives the
    same bytes and name (written again only when missing), and a changed checkout a new name, since
    Spark refuses a file of the same name with other contents within one application. Give it to
    ``spark.submit.pyFiles`` (``--py-files``), ``SparkContext.addPyFile`` or, on Spark Connect,
    ``spark.addArtifacts(path, pyfile=True)``.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            for name, path in _package_files(package):
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"pyspark_logsource-{_version()}-{hashlib.sha256(data).hexdigest()[:12]}.zip"
    if not target.exists():
        # Written aside and renamed, so that a concurrent run or an interrupted one never leaves half a zip.
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".plog-ship-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a cluster's other users
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def shipping_conf(zip_path: str | os.PathLike[str], executors_python: str | None = None) -> dict[str, str]:
    """The Spark settings that make executors without plog run ``format("plog")`` from ``zip_path``.

    ``spark.submit.pyFiles`` copies the zip into every executor's working directory and puts it on the
    ``sys.path`` of its Python UDF workers. The tasks of a data source that Spark finds itself are not
    UDFs: they get none of the shipped files and run the driver's Python (module docstring), so
    ``spark.executorEnv.PYTHONPATH`` names the zip, relative to the executor's working directory where
    Spark put it, and ``spark.sql.execution.pyspark.python`` (given ``executors_python``, e.g.
    ``./environment/bin/python`` for a packed environment in ``spark.archives``) names the executors'
    Python. The driver's Python needs plog installed. Give these to the session's builder or as
    ``spark-submit --conf``; they are read when the session starts.
    """
    name = Path(zip_path).name
    conf = {"spark.submit.pyFiles": str(zip_path), "spark.executorEnv.PYTHONPATH": name}
    if executors_python is not None:
        conf["spark.sql.execution.pyspark.python"] = executors_python
    return conf
