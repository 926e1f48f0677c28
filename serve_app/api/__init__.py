"""The ingress: the OpenAI HTTP API, its middlewares, and the relay of the engine's answer to the client."""
