"""Small shared helpers: atomic writes, JSONL metrics, progress, device and seeding."""
