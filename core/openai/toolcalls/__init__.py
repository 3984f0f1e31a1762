"""Tool calls and reasoning read out of a model's text, whole or while it streams.

`families.py` knows each model family's call syntax (Hermes/Qwen `<tool_call>`,
Llama 3.x JSON, Mistral `[TOOL_CALLS]`, and the JSON array a forced call is
constrained to); `reading.py` splits a text (or the text so far) into
reasoning, content and calls; `forced.py` is the grammar a required or named
call is held to; `template.py` reads a text by a model folder's own response
template instead, with transformers' parser, once serve has registered it.
Pure: no I/O, no tokenizer.
"""
