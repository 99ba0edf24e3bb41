//! The wall clock every layer reads: epoch milliseconds (UTC). A leaf: it imports nothing of
//! the crate, so the ground floor can use it.

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A new id that sorts by creation time (UUID version 7: the epoch milliseconds, then random
/// bits), for the ids of records written at request rate and indexed (trace ids, completion
/// ids, which `/v1` session keys carry). A random (v4) key puts each new index entry on a
/// random page: every commit then rewrites a page per row and index, and under load the
/// record writer spent its time in the kernel writing the WAL and fell behind; time-ordered
/// keys go in at the end of their index (benches/v1_proxy/README.md, issue 29).
pub fn ordered_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}
