"""The test and benchmark harness: local sglang servers and engines on CPU, the tiny model builder, a local Ray
Serve app, benchmark result files. Tests, benchmarks and load tests import it; the product never does."""
