"""kvcost.serving.engines: adapters to real engines: vLLM KV events (ingest, ZMQ subscriber) and metrics scrape."""
