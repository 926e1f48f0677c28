"""The engine backends behind `replica.backend.EngineBackend`: `sim` and `sglang`."""
