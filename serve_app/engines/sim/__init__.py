"""The `sim` backend: the simulator's engine (the same policy core as the sglang plugin) in real time.

`sim_backend` (the `EngineBackend`, a thin orchestrator) over `loop` (schedule -> execute -> update in
real time), `streams` (each request's token counts, from the loop to its stream), `prefix_cache`
(sessions' cached context), `synthetic_text` (the words a stream carries) and `stop` (stop
sequences across chunk boundaries). `settings` holds `args.sim` and the rule set's policy the backend
starts from; `serving` answers OpenAI requests, written by `formats`.
"""
