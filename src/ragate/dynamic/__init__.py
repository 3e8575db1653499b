"""Dynamic retrieval: triggers that watch the token stream and say where to stop and retrieve (ETC, ...)."""
