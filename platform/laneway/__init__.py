"""laneway: an OpenAI-compatible LLM serving gateway that schedules, not just forwards."""

__version__ = "0.1.0"
