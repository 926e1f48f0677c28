"""The `sglang` backend: `sglang.Engine` (0.5.23) in the replica's process, answered by sglang's own OpenAI
serving classes."""
