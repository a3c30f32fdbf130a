"""The OpenAI-compatible gateway: kvcost in the request path in front of real engines (``kvcost serve --engine``)."""
