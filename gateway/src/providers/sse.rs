//! Server-Sent-Events parsing for the streaming HTTP providers: a byte-level line parser that
//! tolerates chunk boundaries anywhere (inside a line, a CRLF pair or a UTF-8 character), and a
//! reader that pulls events out of a response body.

use std::collections::VecDeque;

use http_body_util::BodyExt;
use hyper::body::Incoming;

/// One dispatched event: its `event:` name (None means the default `message`) and its data,
/// with the lines of a multi-line `data:` joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Incremental SSE parser: feed it bytes as they arrive, take out complete events.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of the line being read (no terminator yet).
    line: Vec<u8>,
    /// The previous byte ended a line with `\r`; a following `\n` belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; appends every event it completes to `out`.
    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut VecDeque<SseEvent>) {
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(stripped) = rest.strip_prefix(b"\n") {
                rest = stripped;
            }
        }
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', rest) {
            let line_here = &rest[..pos];
            let terminator = rest[pos];
            rest = &rest[pos + 1..];
            if terminator == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.line.is_empty() {
                // The whole line is in this chunk: read in place.
                self.line_done(line_here, out);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(line_here);
                self.line_done(&line, out);
                line.clear();
                self.line = line;
            }
        }
        self.line.extend_from_slice(rest);
    }

    /// The body ended: an unterminated last line is taken as a line, and a pending event
    /// (one with data but no blank line after it) is dispatched.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<SseEvent>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out);
        }
        self.dispatch(out);
    }

    fn line_done(&mut self, line: &[u8], out: &mut VecDeque<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.first() == Some(&b':') {
            return; // comment (keep-alive)
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(at) => {
                let (field, value) = line.split_at(at);
                let value = value.get(1..).unwrap_or_default();
                (field, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&text(value));
                self.has_data = true;
            }
            b"event" => self.event = Some(text(value).into_owned()),
            _ => {} // id, retry and unknown fields are of no use here
        }
    }

    fn dispatch(&mut self, out: &mut VecDeque<SseEvent>) {
        let event = self.event.take().filter(|e| !e.is_empty());
        if self.has_data {
            self.has_data = false;
            out.push_back(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
            });
        }
    }
}

/// A field's value as text: borrowed when it is valid UTF-8 (the checked conversion is a
/// fraction of the lossy one's cost), invalid sequences replaced otherwise.
fn text(value: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(value) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(value),
    }
}

/// Reads SSE events from a response body.
pub(crate) struct SseReader {
    body: Incoming,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
    ended: bool,
}

impl SseReader {
    pub(crate) fn new(body: Incoming) -> Self {
        Self {
            body,
            parser: SseParser::new(),
            ready: VecDeque::new(),
            ended: false,
        }
    }

    /// The next event; Ok(None) once the body has ended and every event was taken.
    pub(crate) async fn next(&mut self) -> Result<Option<SseEvent>, hyper::Error> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(chunk) = frame.data_ref() {
                        self.parser.push(chunk, &mut self.ready);
                    }
                }
                Some(Err(err)) => return Err(err),
                None => {
                    self.ended = true;
                    self.parser.finish(&mut self.ready);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = VecDeque::new();
        for chunk in input.chunks(piece) {
            parser.push(chunk, &mut out);
        }
        parser.finish(&mut out);
        out.into_iter().collect()
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
        }
    }

    #[test]
    fn data_lines_and_blank_line_dispatch() {
        let input = b"data: one\n\ndata: two\n\n";
        assert_eq!(
            parse_in_pieces(input, 1000),
            vec![ev(None, "one"), ev(None, "two")]
        );
    }

    #[test]
    fn multi_line_data_is_joined_with_newline() {
        let input = b"data: a\ndata: b\ndata:c\n\n";
        assert_eq!(parse_in_pieces(input, 1000), vec![ev(None, "a\nb\nc")]);
    }

    #[test]
    fn event_names_and_comments() {
        let input = b": keep-alive\nevent: message_start\ndata: {\"x\":1}\n\n:ping\n\nevent: ping\ndata: {}\n\n";
        assert_eq!(
            parse_in_pieces(input, 1000),
            vec![
                ev(Some("message_start"), "{\"x\":1}"),
                ev(Some("ping"), "{}")
            ]
        );
    }

    #[test]
    fn event_name_does_not_leak_into_next_event() {
        let input = b"event: a\ndata: 1\n\ndata: 2\n\n";
        assert_eq!(
            parse_in_pieces(input, 1000),
            vec![ev(Some("a"), "1"), ev(None, "2")]
        );
    }

    #[test]
    fn crlf_and_lone_cr_line_endings() {
        let crlf = b"event: e\r\ndata: x\r\n\r\ndata: y\r\n\r\n";
        let cr = b"event: e\rdata: x\r\rdata: y\r\r";
        let expected = vec![ev(Some("e"), "x"), ev(None, "y")];
        for piece in 1..crlf.len() {
            assert_eq!(parse_in_pieces(crlf, piece), expected, "crlf piece {piece}");
            assert_eq!(parse_in_pieces(cr, piece), expected, "cr piece {piece}");
        }
    }

    #[test]
    fn any_chunk_boundary_gives_the_same_events() {
        let input = "event: delta\r\ndata: {\"t\":\"héllo 🌍\"}\r\n\r\n: c\n\ndata: a\ndata: b\n\ndata: [DONE]\n\n";
        let expected = vec![
            ev(Some("delta"), "{\"t\":\"héllo 🌍\"}"),
            ev(None, "a\nb"),
            ev(None, "[DONE]"),
        ];
        for piece in 1..=input.len() {
            assert_eq!(
                parse_in_pieces(input.as_bytes(), piece),
                expected,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn field_without_colon_and_space_handling() {
        // "data" alone is an empty data line; only one leading space is stripped.
        let input = b"data\ndata:  two spaces\n\n";
        assert_eq!(
            parse_in_pieces(input, 1000),
            vec![ev(None, "\n two spaces")]
        );
    }

    #[test]
    fn event_without_data_is_not_dispatched() {
        let input = b"event: lonely\n\ndata: x\n\n";
        assert_eq!(parse_in_pieces(input, 1000), vec![ev(None, "x")]);
    }

    #[test]
    fn unterminated_last_event_is_dispatched_at_end() {
        let input = b"data: a\n\ndata: tail";
        assert_eq!(
            parse_in_pieces(input, 3),
            vec![ev(None, "a"), ev(None, "tail")]
        );
    }

    #[test]
    fn empty_chunks_between_cr_and_lf() {
        let mut parser = SseParser::new();
        let mut out = VecDeque::new();
        for chunk in [&b"data: x\r"[..], b"", b"\n", b"", b"\r", b"", b"\n"] {
            parser.push(chunk, &mut out);
        }
        assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![ev(None, "x")]);
    }

    #[test]
    fn multi_byte_text_split_anywhere_and_invalid_bytes_replaced() {
        let input = "event: é\ndata: 漢字 😀\n\n".as_bytes();
        for piece in 1..input.len() {
            assert_eq!(
                parse_in_pieces(input, piece),
                vec![ev(Some("é"), "漢字 😀")],
                "pieces of {piece}"
            );
        }
        let invalid = b"data: a\xffb\xe2\x82\n\n";
        assert_eq!(
            parse_in_pieces(invalid, 3),
            vec![ev(None, "a\u{fffd}b\u{fffd}")]
        );
    }

    #[test]
    fn ignores_id_and_retry() {
        let input = b"id: 7\nretry: 100\ndata: x\n\n";
        assert_eq!(parse_in_pieces(input, 1000), vec![ev(None, "x")]);
    }
}
