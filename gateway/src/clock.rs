//! The wall clock every layer reads: epoch milliseconds (UTC). A leaf: it imports nothing of
//! the crate, so the ground floor can use it.

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
