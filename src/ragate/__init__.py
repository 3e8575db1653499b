"""ragate: decide when a language model should retrieve, and how it should choose what to read."""

from ragate.types import Generation, GenerationRequest, Message, TopLogprob

__all__ = ["Generation", "GenerationRequest", "Message", "TopLogprob", "__version__"]
__version__ = "0.1.0"
