"""The `sglang` backend: `sglang.Engine` (0.5.23) in the replica's process, answered by sglang's own OpenAI
serving classes.

`sglang_backend` (the `EngineBackend`: start, restart, relay) over `engine_thread` (the loop the engine is built
on and always called on), `openai_serving` (sglang's serving classes writing each response), `load_snapshot`
(sglang's load as the router's `ReplicaLoad`) and `kv_events` (sglang's KV event stream as our events, for
what the replica publishes its engine holds).
"""
