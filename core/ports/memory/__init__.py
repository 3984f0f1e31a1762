"""The job table in memory: every store protocol of core/ports over one set of rows.

- `rows`: the rows (jobs, requests, tenants, keys, files, batches, ...),
  their clock and the lock each store call holds;
- `queue`, `catalog`, `keys`, `files`, `serving`: one store a module, with
  the SQL stores' semantics (tests/integration/test_*_contract.py hold every
  implementation to the same rules);
- `reads`: rows read back as the records the stores hand out;
- `table`: `MemoryTable`, all of them over one set of rows.

The real daemon, the HTTP handlers and the commands run on it in unit tests.
"""

from fsched.core.ports.memory.queue import MemoryQueueStore
from fsched.core.ports.memory.rows import MemoryRequest
from fsched.core.ports.memory.table import MemoryTable

__all__ = ["MemoryQueueStore", "MemoryRequest", "MemoryTable"]
