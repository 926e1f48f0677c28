"""fairshare-serve's Ray Serve application: the OpenAI API in front of engine replicas in lanes.

A request's path through the folders (`app.build_app` wires the deployments):

1. `api/`: the `Ingress` deployment. `http_app` is its FastAPI app with the ASGI middlewares (`request_log`: request
   ids; `auth`: the API keys, each naming a tenant; `request_rules`: the body guard) and the error handlers;
   `ingress` names the request's tenant (`tenants/`), checks the model, counts the prompt (`endpoints`,
   `serve_app.tokenizer`) and hands the request to the engine handle; `relay` streams the engine's bytes back,
   counting (`request_count`) and timing (`routed_call`) it.
2. `routing/`: the engine handle's request router. `lane_router` is the Serve adapter (`LaneRouter`), `lane_policy`
   the pure policy it calls, with `placement` (the rules), `load_correction` (a published load, less what has ended
   since and with what was sent since), `ttft_prediction`, `backpressure`, `tenant_limits` and `records` (what crosses
   the ingress, the router and the replicas).
3. `replica/`: the `Engine` deployment (`engine_replica`): backpressure on arrival, the backend interface
   (`backend`) and the stream's spacing (`pacing`).
4. `engines/sim/`, `engines/sglang/`: the two backends behind that interface. sim runs the simulator's engine in
   real time and writes OpenAI responses itself; sglang runs `sglang.Engine` on its own thread (`engine_thread`)
   and answers with sglang's own OpenAI serving classes (`openai_serving`).
5. `embeddings/`: the `Embedder` deployment for `/v1/embeddings`.

Beside the path: `tenants/` (whom a request is billed to: the API key table, the tenant of a request), `protocol/`
(OpenAI's wire format: request and response models, the error body, SSE events), `config/` (the typed config, live
knobs, the config checker and the KubeRay generator) and `metrics`.
`autoscaling/`: Engine autoscaling on service levels (`signals` replicas publish, `decision`, `serve_policy`).
"""
