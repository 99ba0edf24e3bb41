//! Retries with backoff and per-attempt timeouts around single provider attempts.
