//! PLACEHOLDER (replaced by the real validator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Clean,
    Suspicious(Vec<&'static str>),
    Malicious(Vec<&'static str>),
}
impl Verdict {
    pub fn rules(&self) -> &[&'static str] {
        match self {
            Verdict::Clean => &[],
            Verdict::Suspicious(r) | Verdict::Malicious(r) => r,
        }
    }
}
pub fn check(content: &str) -> Verdict {
    let l = content.to_lowercase();
    if l.contains("ignore all previous instructions") {
        Verdict::Malicious(vec!["override"])
    } else if l.contains("system prompt") {
        Verdict::Suspicious(vec!["system_prompt"])
    } else {
        Verdict::Clean
    }
}
