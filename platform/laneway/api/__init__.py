"""The OpenAI-compatible HTTP surface: translates between the wire and the pipeline."""
