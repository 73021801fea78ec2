"""Shared fixtures. Fixture families live in their own modules, loaded here."""

pytest_plugins = [
    "tests.fixtures_s3",
    "tests.fixtures_gcs",
    "tests.fixtures_azure",
    "tests.fixtures_spark",
    "tests.fault_proxy",
    "tests.fixtures_cli",
]
