"""Locust load tests of the deployed service and a side-by-side policy benchmark (`python -m loadtests.bench`)."""
