"""The machinery tests, benchmarks and scripts run the app with, kept off the floors that serve visitors:
the app on localhost and Debian chromium to drive it (localhost.py), and what the benchmarks' reports share
(reports.py: an earlier commit's files for before/after runs, the nearest-rank percentile). Imported by
benchmarks/, scripts/ and tests/ only (tests/test_layers.py)."""
