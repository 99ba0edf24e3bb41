//! A JSON request body parsed straight into its typed value with serde (poem-openapi's `Json`
//! first builds a JSON tree, then walks it), documented with the type's poem-openapi schema.
//! Failures are 400s whose `param` is the path of the offending member
//! (`messages[0].role`); range rules the schema declares are checked by [`Validate`].

use poem::{FromRequest, Request, RequestBody};
use poem_openapi::payload::{Json, ParsePayload, Payload};
use poem_openapi::registry::{MetaSchemaRef, Registry};
use poem_openapi::types::Type;
use serde::de::DeserializeOwned;

use crate::transport::problem::{Problem, V1Error};

/// The rules serde cannot express (ranges, non-empty lists): the same ones the type's
/// poem-openapi validators declare in the document.
pub trait Validate {
    fn validate(&self) -> Result<(), Problem>;
}

/// A strictly parsed JSON body: unknown members, wrong types and broken JSON are 400s.
pub struct StrictJson<T>(pub T);

impl<T: Type> Payload for StrictJson<T> {
    const CONTENT_TYPE: &'static str = "application/json; charset=utf-8";

    fn check_content_type(content_type: &str) -> bool {
        content_type == "application/json" || Json::<T>::check_content_type(content_type)
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

/// `messages[0].content` for serde_path_to_error's `messages[0].content` / `.` (root).
fn param_of(path: &serde_path_to_error::Path) -> Option<String> {
    let text = path.to_string();
    (text != "." && !text.is_empty()).then_some(text)
}

/// Parses `bytes` into `T` and applies its rules. The path of a failure is found by a second
/// parse that tracks it, so a good body is read once without that bookkeeping.
pub fn parse<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, Problem> {
    let value: T = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(_) => return Err(refusal::<T>(bytes)),
    };
    value.validate()?;
    Ok(value)
}

/// Why `bytes` is not a `T`, naming the offending member's path when there is one.
fn refusal<T: DeserializeOwned>(bytes: &[u8]) -> Problem {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let e = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(_) => match de.end() {
            Ok(()) => return Problem::bad_request("Invalid request"),
            Err(e) => return Problem::bad_request(format!("Invalid request: {e}")),
        },
        Err(e) => e,
    };
    let message = format!("Invalid request: {}", e.inner());
    match param_of(e.path()) {
        Some(param) if !e.inner().is_syntax() && !e.inner().is_eof() => {
            Problem::invalid_param(&param, message)
        }
        _ => Problem::bad_request(message),
    }
}

impl<T: Type + DeserializeOwned + Validate> ParsePayload for StrictJson<T> {
    const IS_REQUIRED: bool = true;

    async fn from_request(request: &Request, body: &mut RequestBody) -> poem::Result<Self> {
        let bytes = Vec::<u8>::from_request(request, body).await?;
        parse(&bytes).map(Self).map_err(|p| V1Error(p).into())
    }
}

poem_openapi::impl_apirequest_for_payload!(StrictJson<T>, T: Type + DeserializeOwned + Validate);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::v1::types::{ChatCompletionRequest, Content, Role};

    fn chat(extra: &str) -> Result<ChatCompletionRequest, Problem> {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
        parse(body.as_bytes())
    }

    fn refused(extra: &str) -> (Option<String>, String) {
        let p = chat(extra).map(drop).unwrap_err();
        assert_eq!(p.status.as_u16(), 400);
        (p.param, p.message)
    }

    #[test]
    fn a_plain_request_parses() {
        let r =
            chat(r#","stream":true,"stream_options":{"include_usage":true},"temperature":null"#)
                .unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(r.messages[0].role, Role::User);
        assert_eq!(r.messages[0].content, Content::Text("hi".into()));
        assert_eq!(r.stream, Some(true));
        assert_eq!(r.temperature, None);
        assert_eq!(r.stream_options.unwrap().include_usage, Some(true));
    }

    #[test]
    fn temperature_limits() {
        for ok in ["0", "2", "2.0", "1.3"] {
            assert!(chat(&format!(r#","temperature":{ok}"#)).is_ok(), "{ok}");
        }
        for bad in ["-0.1", "2.0000001", "2.5"] {
            let (param, message) = refused(&format!(r#","temperature":{bad}"#));
            assert_eq!(param.as_deref(), Some("temperature"), "{bad}");
            assert!(message.contains("temperature"), "{message}");
        }
    }

    #[test]
    fn max_tokens_limits() {
        assert!(chat(r#","max_tokens":1"#).is_ok());
        assert!(chat(r#","max_tokens":4294967295"#).is_ok());
        for bad in ["0", "4294967296", "-1", "1.5", "\"3\""] {
            let (param, _) = refused(&format!(r#","max_tokens":{bad}"#));
            assert_eq!(param.as_deref(), Some("max_tokens"), "{bad}");
        }
    }

    #[test]
    fn unknown_members_wrong_types_and_broken_json_are_refused() {
        let (_, message) = refused(r#","frobnicate":1"#);
        assert!(message.contains("frobnicate"), "{message}");
        let p = parse::<ChatCompletionRequest>(
            br#"{"model":"m","messages":[{"role":"user","content":"hi","name_of_thing":"x"}]}"#,
        )
        .map(drop)
        .unwrap_err();
        assert!(p.message.contains("name_of_thing"), "{}", p.message);
        let p = parse::<ChatCompletionRequest>(
            br#"{"model":"m","messages":[{"role":"wizard","content":"hi"}]}"#,
        )
        .map(drop)
        .unwrap_err();
        assert_eq!(p.param.as_deref(), Some("messages[0].role"));
        for broken in [
            &b""[..],
            b"{",
            br#"{"model":"m","messages":["#,
            b"[]",
            b"null",
        ] {
            let p = parse::<ChatCompletionRequest>(broken)
                .map(drop)
                .unwrap_err();
            assert_eq!(p.status.as_u16(), 400);
        }
        let p = parse::<ChatCompletionRequest>(br#"{"model":"m","messages":[]} x"#)
            .map(drop)
            .unwrap_err();
        assert_eq!(p.status.as_u16(), 400);
        let (param, _) = refused(r#","stream_options":{"include_usage":true,"x":1}"#);
        assert!(param.is_some_and(|p| p.starts_with("stream_options")));
    }

    #[test]
    fn empty_model_and_messages_are_refused() {
        let p = parse::<ChatCompletionRequest>(
            br#"{"model":"","messages":[{"role":"user","content":"x"}]}"#,
        )
        .map(drop)
        .unwrap_err();
        assert_eq!(p.param.as_deref(), Some("model"));
        let p = parse::<ChatCompletionRequest>(br#"{"model":"m","messages":[]}"#)
            .map(drop)
            .unwrap_err();
        assert_eq!(p.param.as_deref(), Some("messages"));
        let p = parse::<ChatCompletionRequest>(br#"{"messages":[{"role":"user","content":"x"}]}"#)
            .map(drop)
            .unwrap_err();
        assert!(p.message.contains("model"), "{}", p.message);
    }

    #[test]
    fn content_blocks_parse() {
        let r = parse::<ChatCompletionRequest>(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
        )
        .unwrap();
        let Content::Parts(parts) = &r.messages[0].content else {
            panic!("parts expected")
        };
        assert_eq!(parts.len(), 2);
        assert!(parts[1].image_url.is_some());
        let p = parse::<ChatCompletionRequest>(
            br#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
        )
        .map(drop)
        .unwrap_err();
        assert_eq!(p.param.as_deref(), Some("messages[0].content"));
    }
}
