"""`fsched serve`: the OpenAI-compatible HTTP API over the job table.

Thin handlers; the translation both ways is the OpenAI protocol's, in core/openai.
"""
