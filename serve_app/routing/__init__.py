"""Choosing the engine replica for each request: the Serve request router, the lane policy it runs, and what
crosses it."""
