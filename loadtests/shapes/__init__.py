"""Load shapes, one per file so Locust picks it: `locust -f loadtests/locustfile.py,loadtests/shapes/<name>.py`.

`article` (the source article's scenario), `ramp` (a step ramp that stops past the knee), `soak`
(a steady mix for a given time), `up_down` (low, up in steps, a plateau, down, low again: an autoscaler's load;
its timeline in `up_down_stages`, which imports no Locust). Their lengths are engine seconds (`--time-scale`
applies).
"""
