"""The model runner: the only place that imports torch and transformers; the boundary test keeps it so.

- model.py   loads a Hugging Face causal LM (or builds the tiny default)
- kvbatch.py one KV cache for the running batch: rows join, leave, park
- sampling.py token choice, reproducible from (seed, position)
- runner.py  executes the scheduler's plans on the model
- decoding.py a fast tokenizer's decode and its incremental decoder (a request's running text)
"""
