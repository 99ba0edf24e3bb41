//! GET /health: liveness without a token, exempt from the rate limit.

use poem::web::Json;
use serde_json::{json, Value};

#[poem::handler]
pub fn health() -> Json<Value> {
    Json(json!({
        "status": "ok",
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }))
}
