"""The job store, split by who uses it.

- `records`: the records both sides exchange, the request id type, the errors;
- `queue`: `QueueStore`, what a daemon needs (claim, write back, leases);
- `catalog`: `CatalogStore`, what the commands need (submit, list, results,
  cancel, tenants, daemons);
- `memory`: an in-memory `QueueStore`, to run the real daemon in unit tests.

`storage` implements both protocols over SQL; the core never imports it.
"""
