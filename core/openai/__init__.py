"""The OpenAI protocol (with vLLM's extensions), apart from fsched's own rules.

What travels on the wire and nothing else: the request fields and what
fsched does with each, the values they take, chat messages, a body read as
requests, online requests and their answers and stream chunks, the Responses
API, /tokenize, the Batch API's input lines, objects and output lines. The
rules of jobs, tenants, keys, limits and states are `fsched.core.jobs`'s;
this package reads and writes them in OpenAI's words, never the other way.
"""
