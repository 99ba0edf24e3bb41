//! The HTTP surfaces (/v1, SSE, limits, static files), media routes, webhooks, and the HTTP
//! providers against a fixture server (whose `Fixture` other areas use).

mod e2e_http;
mod e2e_media;
pub(crate) mod e2e_webhooks;
pub(crate) mod providers_http;
