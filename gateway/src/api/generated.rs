//! The code generated from catalogue/ by build.rs (mirrored in generated/rust/).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Params, result and shared types of every method.
pub mod types {
    include!(concat!(env!("OUT_DIR"), "/types.rs"));
}
/// `MethodId`, `METHODS`, scopes and error codes.
pub mod methods {
    include!(concat!(env!("OUT_DIR"), "/methods.rs"));
}
/// One trait per namespace; `Handlers` bundles them.
pub mod handlers {
    include!(concat!(env!("OUT_DIR"), "/handlers.rs"));
}
/// lookup -> scope -> typed params -> handler.
pub mod dispatch {
    include!(concat!(env!("OUT_DIR"), "/dispatch.rs"));
}

#[cfg(test)]
mod tests {
    use super::types::{FinishReason, MemoryEntryType, MemoryTrustLevel};

    /// `as_str`/`from_wire` agree with the serde names for every value, and other strings are
    /// no value.
    #[test]
    fn generated_wire_names_round_trip_and_match_serde() {
        fn check<T>(all: &[T])
        where
            T: Copy + PartialEq + std::fmt::Debug + serde::Serialize,
            T: WireName,
        {
            for v in all {
                let serde_name = serde_json::to_value(v).unwrap();
                assert_eq!(serde_name, v.wire(), "{v:?}");
                assert_eq!(T::parse(v.wire()), Some(*v));
            }
            assert_eq!(T::parse("no-such-value"), None);
            assert_eq!(T::parse(""), None);
        }
        trait WireName: Sized {
            fn wire(self) -> &'static str;
            fn parse(s: &str) -> Option<Self>;
        }
        macro_rules! wire {
            ($($t:ty),*) => {$(
                impl WireName for $t {
                    fn wire(self) -> &'static str { self.as_str() }
                    fn parse(s: &str) -> Option<Self> { Self::from_wire(s) }
                }
            )*};
        }
        wire!(MemoryEntryType, MemoryTrustLevel, FinishReason);
        check(&[
            MemoryEntryType::Working,
            MemoryEntryType::Episodic,
            MemoryEntryType::Semantic,
            MemoryEntryType::Procedural,
        ]);
        check(&[
            MemoryTrustLevel::System,
            MemoryTrustLevel::Learned,
            MemoryTrustLevel::External,
        ]);
        let reasons: Vec<FinishReason> = ["stop", "length", "tool_calls", "content_filter"]
            .into_iter()
            .filter_map(FinishReason::from_wire)
            .collect();
        assert!(!reasons.is_empty());
        check(&reasons);
    }
}
