//! The chat model's tokenizer, rebuilt from GGUF metadata (GPT-2 style byte-level BPE), and
//! a streaming decoder that only emits complete UTF-8 text.
//!
//! Encoding uses the `tokenizers` crate: a BPE model from `tokenizer.ggml.tokens` and
//! `tokenizer.ggml.merges`, with SmolLM's pre-tokenizer (single digits, then the GPT-2
//! byte-level split). Control tokens (`<|im_start|>`, ...) are never produced from text:
//! the chat template inserts them by id, so text that spells them stays plain text.
//! Decoding is done here: each token's characters map back to bytes through the GPT-2
//! byte table, and bytes are released only once they form whole UTF-8 characters.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::Tokenizer;

/// GGUF token type of control tokens.
const TOKEN_TYPE_CONTROL: i32 = 3;

/// A byte-level BPE tokenizer built from a GGUF file's metadata.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// Raw bytes of each token id (empty for control tokens).
    token_bytes: Vec<Vec<u8>>,
    ids: HashMap<String, u32>,
    pub eos_id: u32,
    pub bos_id: Option<u32>,
}

fn md<'a>(ct: &'a gguf_file::Content, key: &str) -> Result<&'a gguf_file::Value, String> {
    ct.metadata
        .get(key)
        .ok_or_else(|| format!("GGUF metadata has no {key}"))
}

fn md_strings(ct: &gguf_file::Content, key: &str) -> Result<Vec<String>, String> {
    md(ct, key)?
        .to_vec()
        .map_err(|e| format!("{key}: {e}"))?
        .iter()
        .map(|v| v.to_string().cloned().map_err(|e| format!("{key}: {e}")))
        .collect()
}

fn md_u32(ct: &gguf_file::Content, key: &str) -> Result<u32, String> {
    md(ct, key)?.to_u32().map_err(|e| format!("{key}: {e}"))
}

fn value_as_i32(v: &gguf_file::Value) -> Option<i32> {
    use gguf_file::Value as V;
    match v {
        V::I32(x) => Some(*x),
        V::U32(x) => i32::try_from(*x).ok(),
        V::I8(x) => Some(i32::from(*x)),
        V::U8(x) => Some(i32::from(*x)),
        V::I16(x) => Some(i32::from(*x)),
        V::U16(x) => Some(i32::from(*x)),
        V::I64(x) => i32::try_from(*x).ok(),
        V::U64(x) => i32::try_from(*x).ok(),
        _ => None,
    }
}

impl GgufTokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata (model must be "gpt2").
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, String> {
        let model = md(ct, "tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| format!("tokenizer.ggml.model: {e}"))?;
        if model != "gpt2" {
            return Err(format!(
                "tokenizer.ggml.model is {model:?}; only byte-level BPE (gpt2) is supported"
            ));
        }
        let tokens = md_strings(ct, "tokenizer.ggml.tokens")?;
        let merges_raw = md_strings(ct, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = match ct.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| format!("tokenizer.ggml.token_type: {e}"))?
                .iter()
                .map(|v| value_as_i32(v).unwrap_or(1))
                .collect(),
            None => Vec::new(),
        };
        let eos_id = md_u32(ct, "tokenizer.ggml.eos_token_id")?;
        let bos_id = md_u32(ct, "tokenizer.ggml.bos_token_id").ok();

        let mut ids: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (id, tok) in tokens.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| "vocabulary too large".to_string())?;
            ids.entry(tok.clone()).or_insert(id);
        }
        let vocab: Vocab = ids.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut merges = Vec::with_capacity(merges_raw.len());
        for m in &merges_raw {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| format!("malformed merge {m:?}"))?;
            merges.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| format!("building the BPE model: {e}"))?;
        let mut inner = Tokenizer::new(bpe);
        let pre: Vec<PreTokenizerWrapper> = vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ];
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));

        let table = unicode_to_byte();
        let token_bytes = tokens
            .iter()
            .enumerate()
            .map(|(i, tok)| {
                if types.get(i).copied() == Some(TOKEN_TYPE_CONTROL) {
                    Vec::new()
                } else {
                    token_to_bytes(tok, &table)
                }
            })
            .collect();
        Ok(Self {
            inner,
            token_bytes,
            ids,
            eos_id,
            bos_id,
        })
    }

    /// Token ids of plain text (no control tokens are recognised in it).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        self.inner
            .encode(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| format!("tokenizing: {e}"))
    }

    /// The id of a token given by its exact vocabulary string (e.g. `<|im_end|>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// Raw bytes of a token (empty for control tokens and unknown ids).
    pub fn bytes_of(&self, id: u32) -> &[u8] {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The whole text of `ids` (lossy at invalid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut dec = Utf8Stream::default();
        let mut out = String::new();
        for id in ids {
            out.push_str(&dec.push(self.bytes_of(*id)));
        }
        out.push_str(&dec.finish());
        out
    }
}

/// The GPT-2 byte <-> printable character table, inverted: char -> byte.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..=255 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            char::from_u32(b)
        } else {
            let c = char::from_u32(256 + extra);
            extra += 1;
            c
        };
        if let (Some(c), Ok(byte)) = (c, u8::try_from(b)) {
            map.insert(c, byte);
        }
    }
    map
}

fn token_to_bytes(token: &str, table: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match table.get(&c) {
            Some(b) => out.push(*b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// Collects bytes and releases them as text only when they form whole UTF-8 characters.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text now complete (possibly empty). Invalid sequences become
    /// U+FFFD; an incomplete trailing sequence is held back.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.drain(false)
    }

    /// Releases whatever is held (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, last: bool) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            if last {
                                out.push('\u{FFFD}');
                                self.pending.clear();
                            } else {
                                self.pending.drain(..valid);
                            }
                            return out;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn byte_table_round_trips() {
        let table = unicode_to_byte();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'a'], b'a');
        assert_eq!(token_to_bytes("Ġthe", &table), b" the");
    }

    #[test]
    fn utf8_stream_holds_split_characters() {
        let mut s = Utf8Stream::default();
        let euro = "€".as_bytes();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.push(&[0xff, b'b']), "\u{FFFD}b");
        assert_eq!(s.push(&euro[..2]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
