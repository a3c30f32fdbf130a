"""kvcost.serving: the FastAPI scoring service and its engine adapters (KV events, metrics scrape)."""
