"""fairshare-serve's Ray Serve application: OpenAI API in front of engine replicas in two lanes.

Package map:
`config` (the typed app config, engine and routing knobs), `protocol` (OpenAI request/response
models and error bodies), `tokenizer` (token counting: approximate for `sim`, the model's for
`sglang`), `engine_backend` (the one engine interface and its records), `sim_backend` (the
simulator driven in real time), `sglang_backend` (in-process `sglang.Engine`), `routing` (the
lane/affinity/load policy, pure), `router` (that policy as a Serve `RequestRouter`), `engine`
(the engine replica deployment), `ingress` (the FastAPI ingress deployment), `metrics` (Ray
metrics), `app` (the builder named in `config.yaml`), `check` (validate a config file before deploying).
"""
