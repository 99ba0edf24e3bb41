//! Server-sent events as a poem-openapi payload: the body is a stream of ready-made frames,
//! and the document describes the event's JSON type. Frames are written here and nowhere
//! else (`event:`, `data:` split on newlines, comments for keep-alive, `retry:`), and a stream
//! of a revocable token ends here when its token stops working ([`until_revoked`]).

use std::marker::PhantomData;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use poem::{IntoResponse, Response};
use poem_openapi::payload::Payload;
use poem_openapi::registry::{
    MetaMediaType, MetaResponse, MetaResponses, MetaSchema, MetaSchemaRef, Registry,
};
use poem_openapi::types::Type;
use poem_openapi::ApiResponse;

/// An SSE response whose events carry `T` as JSON.
pub struct Sse<T> {
    frames: BoxStream<'static, Bytes>,
    _event: PhantomData<fn() -> T>,
}

impl<T> Sse<T> {
    pub fn new(frames: BoxStream<'static, Bytes>) -> Self {
        Self {
            frames,
            _event: PhantomData,
        }
    }
}

impl<T: Type> Payload for Sse<T> {
    const CONTENT_TYPE: &'static str = "text/event-stream";

    /// The body is text (`event:`/`data:` lines); each `data:` carries one JSON value of
    /// `T`'s schema (registered under its name) or, for `/v1` chat, the literal `[DONE]`.
    fn schema_ref() -> MetaSchemaRef {
        MetaSchemaRef::Inline(Box::new(MetaSchema {
            description: Some(
                "Server-sent events. Each `data:` line holds one JSON event of the schema the operation names (the chat completion stream ends with `data: [DONE]`).",
            ),
            ..MetaSchema::new_with_format("string", "event-stream")
        }))
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: Type> IntoResponse for Sse<T> {
    fn into_response(self) -> Response {
        // Counted in `agentgw_sse_subscribers` until the body is dropped (the stream ended or
        // the client went away), whichever way it ends.
        let open = crate::metrics::SseSubscriber::open();
        Response::builder()
            .content_type("text/event-stream")
            .header(http::header::CACHE_CONTROL, "no-cache")
            .header("x-accel-buffering", "no")
            .body(poem::Body::from_bytes_stream(self.frames.map(
                move |frame| {
                    let _open = &open;
                    Ok::<_, std::io::Error>(frame)
                },
            )))
    }
}

impl<T: Type> ApiResponse for Sse<T> {
    fn meta() -> MetaResponses {
        MetaResponses {
            responses: vec![MetaResponse {
                description: "An event stream",
                status: Some(200),
                status_range: None,
                content: vec![MetaMediaType {
                    content_type: Self::CONTENT_TYPE,
                    schema: Self::schema_ref(),
                }],
                headers: vec![],
            }],
        }
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

/// One event: an optional name and its data (each line of `data` its own `data:` line).
pub fn frame(event: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(name) = event {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// A comment line: ignored by clients, keeps proxies and idle timers from closing the stream.
pub fn comment(text: &str) -> Bytes {
    Bytes::from(format!(": {text}\n\n"))
}

/// `frames` until `watch` fires (the token was revoked, rotated or expired): then one comment
/// naming the reason, and the stream ends (so does whatever produced the frames: dropping a
/// streaming turn cancels it). Without a watch (a token that cannot be revoked), `frames`
/// as they are: nothing is added per frame.
pub fn until_revoked(
    frames: BoxStream<'static, Bytes>,
    watch: Option<crate::hub::StreamWatch>,
) -> BoxStream<'static, Bytes> {
    let Some(watch) = watch else {
        return frames;
    };
    futures_util::stream::unfold((frames, Some(watch)), |(mut frames, watch)| async move {
        let watch = watch?;
        tokio::select! {
            biased;
            _ = watch.revoked().cancelled() => {
                let last = comment(watch.reason());
                Some((last, (frames, None)))
            }
            frame = frames.next() => frame.map(|f| (f, (frames, Some(watch)))),
        }
    })
    .boxed()
}

/// The reconnect delay clients should use.
pub fn retry(ms: u64) -> Bytes {
    Bytes::from(format!("retry: {ms}\n\n"))
}

/// When the first keep-alive comment of a stream ticking every `every` is due. Checked: a
/// far deadline becomes the latest one the clock holds instead of a panic (the configuration
/// caps `gateway.web.sseKeepAliveMs` at 24 hours anyway).
pub fn first_tick(every: std::time::Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(every)
        .or_else(|| now.checked_add(std::time::Duration::from_secs(86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_lines_and_name_events() {
        assert_eq!(frame(None, "[DONE]"), Bytes::from("data: [DONE]\n\n"));
        assert_eq!(
            frame(Some("token"), "a\nb"),
            Bytes::from("event: token\ndata: a\ndata: b\n\n")
        );
        assert_eq!(retry(3000), Bytes::from("retry: 3000\n\n"));
        assert_eq!(comment("ping"), Bytes::from(": ping\n\n"));
    }

    #[tokio::test]
    async fn a_revoked_stream_says_why_and_ends() {
        use futures_util::stream;
        let hub = crate::hub::Hub::default();
        let p =
            crate::api::principal::Principal::api("app", crate::api::scopes::Scopes::all(), None);
        let watch = hub.watch_stream(&p);
        let revoke = watch.revoked().clone();
        let frames = stream::iter([Bytes::from("a")])
            .chain(stream::pending())
            .boxed();
        let mut out = until_revoked(frames, Some(watch));
        assert_eq!(out.next().await, Some(Bytes::from("a")));
        assert_eq!(hub.streams(), 1);
        revoke.cancel();
        assert_eq!(out.next().await, Some(comment("token revoked")));
        assert_eq!(out.next().await, None);
        assert_eq!(hub.streams(), 0, "the ended stream is unregistered");

        let plain = stream::iter([Bytes::from("b")]).boxed();
        let out: Vec<Bytes> = until_revoked(plain, None).collect().await;
        assert_eq!(out, [Bytes::from("b")]);
    }
}
