"""The `Embedder` deployment for `/v1/embeddings`, and the sim embeddings model."""
