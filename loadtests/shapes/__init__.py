"""Load shapes, one per file so Locust picks it: `locust -f loadtests/locustfile.py,loadtests/shapes/<name>.py`.

`article` (the source article's scenario), `ramp` (a step ramp that stops past the knee), `soak`
(a steady mix for a given time). Their lengths are engine seconds (`--time-scale` applies).
"""
