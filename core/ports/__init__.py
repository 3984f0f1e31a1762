"""What the core needs from a job table, split by who uses it.

- `records`: the records the stores exchange (a daemon's heartbeat among
  them), the errors;
- `queue`: `QueueStore`, what a daemon needs (claim, write back, leases);
- `catalog`: `CatalogStore`, what the commands need (submit, list, results,
  cancel, tenants, daemons);
- `keys`, `files`, `serving`: `KeyStore`, `FileStore`, `ServingStore`, what
  the HTTP server needs beyond the catalog;
- `memory`: an in-memory `QueueStore`, to run the real daemon in unit tests;
- `link`: the messages a daemon and an HTTP server exchange over the daemon's
  link (the faster channel beside the table), typed and versioned.

`storage` implements the protocols over SQL; the core never imports it.
"""
