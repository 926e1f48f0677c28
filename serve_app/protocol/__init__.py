"""OpenAI's wire format, shared by the ingress and the backends: request and response models, the error body,
SSE events."""
