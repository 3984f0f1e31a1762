"""`fsched serve`: the OpenAI-compatible HTTP API over the job table.

Thin handlers; the translation both ways is in core/jobs (openai.py, batches.py).
"""
