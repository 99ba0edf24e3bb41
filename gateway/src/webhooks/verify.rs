//! HMAC signature checks for incoming webhooks.
//!
//! The sender signs the raw request body with a shared secret (as GitHub does) and may send a
//! Unix timestamp header. The signature covers the body only, so the timestamp is not
//! authenticated: it bounds how long an honest delivery stays acceptable, and the store's
//! replay guard (`webhook_deliveries`, keyed on the path and the body digest) stops a redelivery
//! of the same signed request from running twice.

use std::fmt;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use sha2::{Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;

use crate::config::webhooks::Algorithm;

/// The longest digest (SHA-512) in bytes: room for any decoded signature.
const MAX_DIGEST_BYTES: usize = 64;

/// HMAC state already keyed with the secret. Each request clones it, so the key is not hashed
/// again per request and the raw secret is not kept in memory by the verifier.
#[derive(Clone)]
enum Keyed {
    Sha256(Hmac<Sha256>),
    Sha384(Hmac<Sha384>),
    Sha512(Hmac<Sha512>),
}

impl Keyed {
    /// `None` cannot happen (HMAC takes keys of any length); it keeps the code free of panics.
    fn new(algorithm: Algorithm, secret: &[u8]) -> Option<Self> {
        Some(match algorithm {
            Algorithm::Sha256 => Keyed::Sha256(Hmac::new_from_slice(secret).ok()?),
            Algorithm::Sha384 => Keyed::Sha384(Hmac::new_from_slice(secret).ok()?),
            Algorithm::Sha512 => Keyed::Sha512(Hmac::new_from_slice(secret).ok()?),
        })
    }

    fn tag(&self, body: &[u8]) -> Vec<u8> {
        fn run<M: Mac + Clone>(mac: &M, body: &[u8]) -> Vec<u8> {
            mac.clone()
                .chain_update(body)
                .finalize()
                .into_bytes()
                .to_vec()
        }
        match self {
            Keyed::Sha256(mac) => run(mac, body),
            Keyed::Sha384(mac) => run(mac, body),
            Keyed::Sha512(mac) => run(mac, body),
        }
    }
}

/// Checks one webhook's signature and timestamp headers; built once per configured webhook.
pub struct Verifier {
    /// `None` only if HMAC refused the key, which it never does: then nothing verifies.
    keyed: Option<Keyed>,
    algorithm: Algorithm,
    /// `None` when the configured name is not a valid header name: the header is then always
    /// missing, so every request is refused rather than accepted.
    header_name: Option<HeaderName>,
    timestamp_header_name: Option<HeaderName>,
    max_age_sec: u64,
    require_timestamp: bool,
}

impl fmt::Debug for Verifier {
    /// Written by hand so that logging a verifier never shows the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("secret", &"<redacted>")
            .field("algorithm", &self.algorithm)
            .field("header_name", &self.header_name)
            .field("timestamp_header_name", &self.timestamp_header_name)
            .field("max_age_sec", &self.max_age_sec)
            .field("require_timestamp", &self.require_timestamp)
            .finish()
    }
}

/// A header name in the form `HeaderMap` stores (lowercase), or `None` if it is not valid.
fn header_name(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.trim().as_bytes()).ok()
}

impl Verifier {
    /// Header names are matched case-insensitively. An invalid header name can never match,
    /// so the configuration should be validated first; an empty secret is accepted here and
    /// should be refused by the configuration too.
    pub fn new(
        secret: &[u8],
        algorithm: Algorithm,
        header_name: &str,
        timestamp_header_name: &str,
        max_age_sec: u64,
        require_timestamp: bool,
    ) -> Self {
        Self {
            keyed: Keyed::new(algorithm, secret),
            algorithm,
            header_name: self::header_name(header_name),
            timestamp_header_name: self::header_name(timestamp_header_name),
            max_age_sec,
            require_timestamp,
        }
    }

    /// Checks the request. `now_unix`: current Unix time in seconds.
    ///
    /// Cheap checks (header shape, timestamp window) run before the HMAC, so junk is refused
    /// without hashing the body. A timestamp exactly `max_age_sec` away, in either direction,
    /// is accepted.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Verified, Rejection> {
        let raw = self
            .header_name
            .as_ref()
            .and_then(|name| headers.get(name))
            .ok_or(Rejection::MissingSignature)?;
        let mut buf = [0u8; MAX_DIGEST_BYTES];
        let claimed = self.parse_signature(raw.as_bytes(), &mut buf)?;

        let timestamp_text = match self
            .timestamp_header_name
            .as_ref()
            .and_then(|name| headers.get(name))
        {
            Some(value) => Some(
                std::str::from_utf8(value.as_bytes())
                    .map_err(|_| Rejection::MalformedTimestamp)?
                    .trim(),
            ),
            None if self.require_timestamp => return Err(Rejection::MissingTimestamp),
            None => None,
        };
        let timestamp = match timestamp_text {
            Some(text) => {
                let at: i64 = text.parse().map_err(|_| Rejection::MalformedTimestamp)?;
                if now_unix.abs_diff(at) > self.max_age_sec {
                    return Err(Rejection::StaleTimestamp);
                }
                Some(at)
            }
            None => None,
        };

        let keyed = self.keyed.as_ref().ok_or(Rejection::BadSignature)?;
        let expected = keyed.tag(body);
        if !bool::from(expected.as_slice().ct_eq(claimed)) {
            return Err(Rejection::BadSignature);
        }

        Ok(Verified { timestamp })
    }

    /// The hex signature for `body` (lowercase, no prefix): used by tests and by clients' docs.
    pub fn sign(&self, body: &[u8]) -> String {
        self.keyed
            .as_ref()
            .map(|keyed| hex::encode(keyed.tag(body)))
            .unwrap_or_default()
    }

    /// Decodes the header into `buf`. Only shape is checked here (UTF-8, optional prefix naming
    /// this algorithm, exact length, hex digits), so a malformed value costs no hashing.
    fn parse_signature<'b>(
        &self,
        raw: &[u8],
        buf: &'b mut [u8; MAX_DIGEST_BYTES],
    ) -> Result<&'b [u8], Rejection> {
        let text = std::str::from_utf8(raw)
            .map_err(|_| Rejection::MalformedSignature)?
            .trim();
        let digits = match text.split_once('=') {
            Some((prefix, rest)) if prefix.eq_ignore_ascii_case(self.algorithm.as_str()) => rest,
            Some(_) => return Err(Rejection::MalformedSignature),
            None => text,
        };
        if digits.len() != self.algorithm.hex_len() {
            return Err(Rejection::MalformedSignature);
        }
        let out = buf
            .get_mut(..digits.len() / 2)
            .ok_or(Rejection::MalformedSignature)?;
        hex::decode_to_slice(digits, out).map_err(|_| Rejection::MalformedSignature)?;
        Ok(out)
    }
}

/// What a successful check tells the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The timestamp header's value when present.
    pub timestamp: Option<i64>,
}

/// Why a request was refused; every variant is answered with 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No signature header.
    MissingSignature,
    /// The signature header is not hex of the right length, or names another algorithm.
    MalformedSignature,
    /// Well formed, but not the HMAC of this body with this secret.
    BadSignature,
    /// `requireTimestamp` is set and the timestamp header is absent.
    MissingTimestamp,
    /// The timestamp header is not an integer number of seconds.
    MalformedTimestamp,
    /// The timestamp is more than `maxAgeSec` away from now, in the past or the future.
    StaleTimestamp,
}

impl Rejection {
    /// The 401 body's message. Malformed and wrong signatures share one message so that the
    /// answer does not help anyone probe the format.
    pub fn message(self) -> &'static str {
        match self {
            Rejection::MissingSignature => "Missing signature header",
            Rejection::MalformedSignature | Rejection::BadSignature => "Invalid signature",
            Rejection::MissingTimestamp => "Missing timestamp header",
            Rejection::MalformedTimestamp => "Invalid timestamp",
            Rejection::StaleTimestamp => "Timestamp outside the allowed window",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Rejection {}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const SECRET: &[u8] = b"It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const SHA256_HEX: &str = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    // Computed with Python's hmac/hashlib for the same secret and body.
    const SHA384_HEX: &str = "8ae941e23ce94331d5a5986b762bbdb2039fec41c133145da82908f381ba6123\
                              79307f45738b252be379438ef60839c2";
    const SHA512_HEX: &str = "11ed355a617e98134e842012a7944ccf59c10256cb182357bd7e3a42013ff07c\
                              376f8c14cf5cc1923da20b51d64256b2fb8ebbf100aa67a61326f61fea8111bc";
    const NOW: i64 = 1_700_000_000;
    const MAX_AGE: u64 = 300;

    fn verifier(algorithm: Algorithm, require_timestamp: bool) -> Verifier {
        Verifier::new(
            SECRET,
            algorithm,
            "x-webhook-signature",
            "x-webhook-timestamp",
            MAX_AGE,
            require_timestamp,
        )
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn check(v: &Verifier, pairs: &[(&str, &str)]) -> Result<Verified, Rejection> {
        v.verify(&headers(pairs), BODY, NOW)
    }

    fn sig(value: &str) -> Vec<(&'static str, String)> {
        vec![("x-webhook-signature", value.to_string())]
    }

    fn check_sig(v: &Verifier, value: &str) -> Result<Verified, Rejection> {
        let pairs = sig(value);
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        check(v, &pairs)
    }

    fn with_ts(ts: &str) -> Result<Verified, Rejection> {
        check(
            &verifier(Algorithm::Sha256, false),
            &[
                ("x-webhook-signature", SHA256_HEX),
                ("x-webhook-timestamp", ts),
            ],
        )
    }

    #[test]
    fn github_published_example_verifies() {
        let v = Verifier::new(
            SECRET,
            Algorithm::Sha256,
            "X-Hub-Signature-256",
            "x-webhook-timestamp",
            MAX_AGE,
            false,
        );
        let h = headers(&[("x-hub-signature-256", &format!("sha256={SHA256_HEX}"))]);
        let ok = v.verify(&h, BODY, NOW).unwrap();
        assert_eq!(ok.timestamp, None);
        assert_eq!(v.sign(BODY), SHA256_HEX);
    }

    #[test]
    fn upper_case_hex_and_prefix_and_bare_hex_verify() {
        let v = verifier(Algorithm::Sha256, false);
        let upper = SHA256_HEX.to_uppercase();
        assert!(check_sig(&v, &format!("sha256={upper}")).is_ok());
        assert!(check_sig(&v, &upper).is_ok());
        assert!(check_sig(&v, SHA256_HEX).is_ok());
        assert!(check_sig(&v, &format!("SHA256={SHA256_HEX}")).is_ok());
        assert!(check_sig(&v, &format!("  sha256={SHA256_HEX}\t")).is_ok());
    }

    #[test]
    fn sha384_and_sha512_vectors() {
        for (algorithm, hex) in [
            (Algorithm::Sha384, SHA384_HEX),
            (Algorithm::Sha512, SHA512_HEX),
        ] {
            let v = verifier(algorithm, false);
            assert_eq!(hex.len(), algorithm.hex_len());
            assert_eq!(v.sign(BODY), hex);
            assert!(check_sig(&v, hex).is_ok());
            assert!(check_sig(&v, &hex.to_uppercase()).is_ok());
            assert!(check_sig(&v, &format!("{}={hex}", algorithm.as_str())).is_ok());
            // The SHA-256 signature is refused by length before any hashing.
            assert_eq!(
                check_sig(&v, SHA256_HEX),
                Err(Rejection::MalformedSignature)
            );
            assert_eq!(
                check_sig(&v, &format!("sha256={hex}")),
                Err(Rejection::MalformedSignature)
            );
        }
    }

    #[test]
    fn missing_signature_header() {
        let v = verifier(Algorithm::Sha256, false);
        assert_eq!(check(&v, &[]), Err(Rejection::MissingSignature));
        assert_eq!(
            check(&v, &[("x-hub-signature-256", SHA256_HEX)]),
            Err(Rejection::MissingSignature)
        );
    }

    #[test]
    fn prefix_naming_another_algorithm_is_refused() {
        let v = verifier(Algorithm::Sha256, false);
        for prefix in ["sha1", "sha512", "md5", ""] {
            assert_eq!(
                check_sig(&v, &format!("{prefix}={SHA256_HEX}")),
                Err(Rejection::MalformedSignature),
                "{prefix}"
            );
        }
        assert_eq!(
            check_sig(&v, &format!("sha256=sha256={SHA256_HEX}")),
            Err(Rejection::MalformedSignature)
        );
    }

    #[test]
    fn wrong_length_is_malformed() {
        let v = verifier(Algorithm::Sha256, false);
        assert_eq!(
            check_sig(&v, &SHA256_HEX[..63]),
            Err(Rejection::MalformedSignature)
        );
        assert_eq!(
            check_sig(&v, &format!("{SHA256_HEX}0")),
            Err(Rejection::MalformedSignature)
        );
        assert_eq!(check_sig(&v, ""), Err(Rejection::MalformedSignature));
        assert_eq!(check_sig(&v, "sha256="), Err(Rejection::MalformedSignature));
        let huge = "a".repeat(100_000);
        assert_eq!(check_sig(&v, &huge), Err(Rejection::MalformedSignature));
    }

    #[test]
    fn non_hex_is_malformed() {
        let v = verifier(Algorithm::Sha256, false);
        let bad = format!("{}g", &SHA256_HEX[..63]);
        assert_eq!(check_sig(&v, &bad), Err(Rejection::MalformedSignature));
        let spaced = format!("{} {}", &SHA256_HEX[..31], &SHA256_HEX[32..]);
        assert_eq!(check_sig(&v, &spaced), Err(Rejection::MalformedSignature));
    }

    #[test]
    fn non_utf8_header_is_malformed() {
        let v = verifier(Algorithm::Sha256, false);
        let mut h = HeaderMap::new();
        let mut bytes = SHA256_HEX.as_bytes().to_vec();
        bytes[0] = 0xff;
        h.insert(
            "x-webhook-signature",
            HeaderValue::from_bytes(&bytes).unwrap(),
        );
        assert_eq!(v.verify(&h, BODY, NOW), Err(Rejection::MalformedSignature));
    }

    #[test]
    fn one_flipped_hex_char_is_bad() {
        let v = verifier(Algorithm::Sha256, false);
        for i in [0, 31, 63] {
            let mut chars: Vec<char> = SHA256_HEX.chars().collect();
            chars[i] = if chars[i] == '0' { '1' } else { '0' };
            let flipped: String = chars.into_iter().collect();
            assert_eq!(check_sig(&v, &flipped), Err(Rejection::BadSignature));
        }
    }

    #[test]
    fn other_body_or_secret_is_bad() {
        let v = verifier(Algorithm::Sha256, false);
        let h = headers(&[("x-webhook-signature", SHA256_HEX)]);
        assert_eq!(
            v.verify(&h, b"Hello, World?", NOW),
            Err(Rejection::BadSignature)
        );
        let other = Verifier::new(
            b"another secret",
            Algorithm::Sha256,
            "x-webhook-signature",
            "x-webhook-timestamp",
            MAX_AGE,
            false,
        );
        assert_eq!(other.verify(&h, BODY, NOW), Err(Rejection::BadSignature));
    }

    #[test]
    fn first_of_several_signature_headers_is_used() {
        let v = verifier(Algorithm::Sha256, false);
        let wrong = "0".repeat(64);
        assert!(check(
            &v,
            &[
                ("x-webhook-signature", SHA256_HEX),
                ("x-webhook-signature", &wrong)
            ]
        )
        .is_ok());
        assert_eq!(
            check(
                &v,
                &[
                    ("x-webhook-signature", &wrong),
                    ("x-webhook-signature", SHA256_HEX)
                ]
            ),
            Err(Rejection::BadSignature)
        );
    }

    #[test]
    fn timestamp_window_edges() {
        let max = MAX_AGE as i64;
        let ok = with_ts(&(NOW - max).to_string()).unwrap();
        assert_eq!(ok.timestamp, Some(NOW - max));
        assert_eq!(
            with_ts(&(NOW - max - 1).to_string()),
            Err(Rejection::StaleTimestamp)
        );
        assert!(with_ts(&(NOW + max).to_string()).is_ok());
        assert_eq!(
            with_ts(&(NOW + max + 1).to_string()),
            Err(Rejection::StaleTimestamp)
        );
        assert!(with_ts(&NOW.to_string()).is_ok());
        assert!(with_ts(&format!(" {NOW} ")).is_ok());
        assert_eq!(with_ts("0"), Err(Rejection::StaleTimestamp));
        assert_eq!(
            with_ts(&i64::MIN.to_string()),
            Err(Rejection::StaleTimestamp)
        );
        assert_eq!(
            with_ts(&i64::MAX.to_string()),
            Err(Rejection::StaleTimestamp)
        );
    }

    #[test]
    fn non_integer_timestamp_is_refused() {
        for ts in ["12.5", "abc", "", "1e9", "0x10", "99999999999999999999"] {
            assert_eq!(with_ts(ts), Err(Rejection::MalformedTimestamp), "{ts:?}");
        }
    }

    #[test]
    fn require_timestamp() {
        let v = verifier(Algorithm::Sha256, true);
        assert_eq!(
            check(&v, &[("x-webhook-signature", SHA256_HEX)]),
            Err(Rejection::MissingTimestamp)
        );
        let now = NOW.to_string();
        let ok = check(
            &v,
            &[
                ("x-webhook-signature", SHA256_HEX),
                ("x-webhook-timestamp", &now),
            ],
        )
        .unwrap();
        assert_eq!(ok.timestamp, Some(NOW));
        // Without the requirement, a missing timestamp is fine.
        let v = verifier(Algorithm::Sha256, false);
        assert!(check(&v, &[("x-webhook-signature", SHA256_HEX)]).is_ok());
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let v = Verifier::new(
            SECRET,
            Algorithm::Sha256,
            "X-Webhook-Signature",
            "X-WEBHOOK-TIMESTAMP",
            MAX_AGE,
            true,
        );
        let now = NOW.to_string();
        let h = headers(&[
            ("X-WEBHOOK-SIGNATURE", SHA256_HEX),
            ("x-Webhook-Timestamp", &now),
        ]);
        assert_eq!(v.verify(&h, BODY, NOW).unwrap().timestamp, Some(NOW));
    }

    #[test]
    fn invalid_header_name_refuses_everything() {
        let v = Verifier::new(
            SECRET,
            Algorithm::Sha256,
            "bad header",
            "x-webhook-timestamp",
            MAX_AGE,
            false,
        );
        let h = headers(&[("x-webhook-signature", SHA256_HEX)]);
        assert_eq!(v.verify(&h, BODY, NOW), Err(Rejection::MissingSignature));
    }

    #[test]
    fn rejection_messages() {
        assert_eq!(
            Rejection::MissingSignature.message(),
            "Missing signature header"
        );
        assert_eq!(Rejection::MalformedSignature.message(), "Invalid signature");
        assert_eq!(Rejection::BadSignature.message(), "Invalid signature");
        assert_eq!(
            Rejection::MissingTimestamp.message(),
            "Missing timestamp header"
        );
        assert_eq!(Rejection::MalformedTimestamp.message(), "Invalid timestamp");
        assert_eq!(
            Rejection::StaleTimestamp.message(),
            "Timestamp outside the allowed window"
        );
        assert_eq!(Rejection::BadSignature.to_string(), "Invalid signature");
    }

    #[test]
    fn algorithm_serde_and_schema() {
        assert_eq!(Algorithm::default(), Algorithm::Sha256);
        assert_eq!(
            serde_json::to_string(&Algorithm::Sha384).unwrap(),
            "\"sha384\""
        );
        let parsed: Algorithm = serde_json::from_str("\"sha512\"").unwrap();
        assert_eq!(parsed, Algorithm::Sha512);
        assert!(serde_json::from_str::<Algorithm>("\"SHA256\"").is_err());
        let schema = serde_json::to_string(&schemars::schema_for!(Algorithm)).unwrap();
        assert!(schema.contains("sha256") && schema.contains("sha512"));
        for a in [Algorithm::Sha256, Algorithm::Sha384, Algorithm::Sha512] {
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                format!("\"{}\"", a.as_str())
            );
        }
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let v = verifier(Algorithm::Sha256, false);
        let text = format!("{v:?} {v:#?}");
        assert!(!text.contains("Secret to Everybody"), "{text}");
        assert!(!text.contains(&hex::encode(SECRET)), "{text}");
        assert!(!text.contains(&format!("{:?}", &SECRET[..8])), "{text}");
        assert!(text.contains("redacted"));
    }
}
