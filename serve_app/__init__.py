"""fairshare-serve's Ray Serve application: OpenAI API in front of engine replicas in two lanes.

The package map is the README's (one map, kept current there); the data path is in `ingress`,
`router` and `engine`'s docstrings.
"""
