"""Models of synchrony: face AUs, streaming ASR, the load controller, frame renderers, responders."""
