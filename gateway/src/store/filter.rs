//! The `where` filter language of `obs.trace.search`.
//!
//! ```text
//! where := term ( AND term )*          at most 16 terms, at most 1024 characters
//! term  := column ws? op ws? value
//! op    := = | == | != | <> | < | > | <= | >=
//! value := "..." | '...' | bare        at most 256 characters
//! ```
//!
//! Keywords (`and`) and column names are case-insensitive; terms are joined by the word `and`
//! with whitespace on both sides. A quoted value may escape its quote character and the
//! backslash with a backslash (`\"`, `\'`, `\\`); any other backslash stands for itself. A bare
//! value is a run of characters other than whitespace and quotes (`shell`, `-12`, `true`,
//! `agent:main/x#1`). The column decides the type of the value, quoted or not: text columns take
//! any value and only `=`/`!=`; integer columns (`seq`, `ts`, `durationMs`, `tokens`) an `i64`;
//! `costUsd` any finite number; `synthetic` `true` or `false` with `=`/`!=`.
//!
//! The expression is parsed into a fixed set of comparisons, never passed to SQL:
//! [`Filter::to_sql`] writes column names and operators from static tables only, and the values
//! go to bound parameters. Positions in error messages count characters from 1.

use std::fmt;

/// Longest expression, in characters (the catalogue's `maxLength` of `where`).
const MAX_INPUT_CHARS: usize = 1024;
/// Most terms in one expression.
const MAX_TERMS: usize = 16;
/// Longest value, in characters (after unescaping).
const MAX_VALUE_CHARS: usize = 256;
/// Longest user text quoted back in an error message, in characters.
const MAX_SHOWN_CHARS: usize = 64;

/// A column of the trace row that a filter may compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Kind,
    SessionKey,
    ChatId,
    MessageId,
    TraceId,
    AgentId,
    Channel,
    ToolName,
    Status,
    FinishReason,
    ErrorKind,
    Seq,
    Ts,
    DurationMs,
    Tokens,
    CostUsd,
    Synthetic,
}

/// Every column, in the order error messages list them.
const COLUMNS: [Column; 17] = [
    Column::Kind,
    Column::SessionKey,
    Column::ChatId,
    Column::MessageId,
    Column::TraceId,
    Column::AgentId,
    Column::Channel,
    Column::ToolName,
    Column::Status,
    Column::FinishReason,
    Column::ErrorKind,
    Column::Seq,
    Column::Ts,
    Column::DurationMs,
    Column::Tokens,
    Column::CostUsd,
    Column::Synthetic,
];

/// What a column holds, which decides the operators and values it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnType {
    Text,
    Int,
    Num,
    Bool,
}

impl Column {
    /// The column's name in the API's trace row (camelCase).
    pub fn api_name(self) -> &'static str {
        match self {
            Column::Kind => "kind",
            Column::SessionKey => "sessionKey",
            Column::ChatId => "chatId",
            Column::MessageId => "messageId",
            Column::TraceId => "traceId",
            Column::AgentId => "agentId",
            Column::Channel => "channel",
            Column::ToolName => "toolName",
            Column::Status => "status",
            Column::FinishReason => "finishReason",
            Column::ErrorKind => "errorKind",
            Column::Seq => "seq",
            Column::Ts => "ts",
            Column::DurationMs => "durationMs",
            Column::Tokens => "tokens",
            Column::CostUsd => "costUsd",
            Column::Synthetic => "synthetic",
        }
    }

    /// The column's name in the SQL table `trace_rows`.
    pub fn sql(self) -> &'static str {
        match self {
            Column::Kind => "kind",
            Column::SessionKey => "session_key",
            Column::ChatId => "chat_id",
            Column::MessageId => "message_id",
            Column::TraceId => "trace_id",
            Column::AgentId => "agent_id",
            Column::Channel => "channel",
            Column::ToolName => "tool_name",
            Column::Status => "status",
            Column::FinishReason => "finish_reason",
            Column::ErrorKind => "error_kind",
            Column::Seq => "seq",
            Column::Ts => "ts",
            Column::DurationMs => "duration_ms",
            Column::Tokens => "tokens",
            Column::CostUsd => "cost_usd",
            Column::Synthetic => "synthetic",
        }
    }

    fn column_type(self) -> ColumnType {
        match self {
            Column::Seq | Column::Ts | Column::DurationMs | Column::Tokens => ColumnType::Int,
            Column::CostUsd => ColumnType::Num,
            Column::Synthetic => ColumnType::Bool,
            _ => ColumnType::Text,
        }
    }

    /// The column named `name`, in any ASCII case.
    fn lookup(name: &str) -> Option<Column> {
        COLUMNS
            .iter()
            .copied()
            .find(|c| c.api_name().eq_ignore_ascii_case(name))
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl Op {
    /// The SQL operator: `=`, `<>`, `<`, `>`, `<=`, `>=`.
    pub fn sql(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Lt => "<",
            Op::Gt => ">",
            Op::Le => "<=",
            Op::Ge => ">=",
        }
    }

    /// The operator in the canonical form of a filter.
    fn symbol(self) -> &'static str {
        match self {
            Op::Ne => "!=",
            other => other.sql(),
        }
    }
}

/// A value to compare a column with, of the column's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
    Num(f64),
    Bool(bool),
}

/// One comparison: `column op value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    pub column: Column,
    pub op: Op,
    pub value: Value,
}

/// A parsed `where` expression: the conjunction of its terms.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Filter {
    pub terms: Vec<Term>,
}

/// Why an expression was refused: a message for the caller, naming the term or position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError(pub String);

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FilterError {}

fn fail<T>(message: String) -> Result<T, FilterError> {
    Err(FilterError(message))
}

/// User text as quoted back in an error message: cut to a readable length.
fn shown(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX_SHOWN_CHARS).collect();
    if chars.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

fn column_list() -> String {
    COLUMNS
        .iter()
        .map(|c| c.api_name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a `where` expression (see the module documentation for the language).
pub fn parse(input: &str) -> Result<Filter, FilterError> {
    if input.len() > MAX_INPUT_CHARS && input.chars().nth(MAX_INPUT_CHARS).is_some() {
        return fail(format!(
            "expression too long: {} characters (at most {MAX_INPUT_CHARS})",
            input.chars().count()
        ));
    }
    let mut p = Parser {
        chars: input.chars().collect(),
        pos: 0,
    };
    p.skip_ws();
    if p.at_end() {
        return fail("empty expression".into());
    }
    let mut terms = Vec::new();
    loop {
        if terms.len() == MAX_TERMS {
            return fail(format!("too many terms (at most {MAX_TERMS})"));
        }
        terms.push(p.term(terms.len() + 1)?);
        let spaced = p.skip_ws();
        if p.at_end() {
            break;
        }
        if !(spaced && p.and_keyword()) {
            return fail(format!(
                "expected 'and' after term {} at position {}",
                terms.len(),
                p.position()
            ));
        }
        p.skip_ws();
        if p.at_end() {
            return fail(format!(
                "expected a term after 'and' at position {}",
                p.position()
            ));
        }
    }
    Ok(Filter { terms })
}

/// A cursor over the expression's characters (never bytes: no slicing inside a character).
struct Parser {
    chars: Vec<char>,
    pos: usize,
}

fn is_quote(c: char) -> bool {
    c == '"' || c == '\''
}

fn is_op_char(c: char) -> bool {
    matches!(c, '=' | '!' | '<' | '>')
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }

    /// The 1-based position of the cursor, for messages.
    fn position(&self) -> usize {
        self.pos + 1
    }

    /// Skips whitespace; whether there was any.
    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
        self.pos > start
    }

    /// Takes characters while `keep` holds.
    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek().filter(|c| keep(*c)) {
            out.push(c);
            self.pos += 1;
        }
        out
    }

    /// Consumes the word `and` (any case) when whitespace or the end follows it.
    fn and_keyword(&mut self) -> bool {
        let word = ['a', 'n', 'd']
            .iter()
            .enumerate()
            .all(|(i, k)| self.peek_at(i).is_some_and(|c| c.eq_ignore_ascii_case(k)));
        let ends = self.peek_at(3).is_none_or(char::is_whitespace);
        if word && ends {
            self.pos += 3;
        }
        word && ends
    }

    /// One term, the `n`th (1-based).
    fn term(&mut self, n: usize) -> Result<Term, FilterError> {
        let name = self.take_while(|c| !c.is_whitespace() && !is_op_char(c) && !is_quote(c));
        if name.is_empty() {
            return fail(format!(
                "expected a column name in term {n} at position {}",
                self.position()
            ));
        }
        let Some(column) = Column::lookup(&name) else {
            return fail(format!(
                "unknown column '{}' (columns: {})",
                shown(&name),
                column_list()
            ));
        };
        self.skip_ws();
        let Some((op, written)) = self.op() else {
            return fail(format!(
                "expected an operator (=, !=, <, >, <=, >=) after '{}' at position {}",
                column.api_name(),
                self.position()
            ));
        };
        self.skip_ws();
        let raw = self.value(column, written)?;
        let length = raw.chars().count();
        if length > MAX_VALUE_CHARS {
            return fail(format!(
                "value of '{}' in term {n} is too long: {length} characters (at most {MAX_VALUE_CHARS})",
                column.api_name()
            ));
        }
        let value = typed(column, op, written, raw)?;
        Ok(Term { column, op, value })
    }

    /// The operator at the cursor, with its spelling.
    fn op(&mut self) -> Option<(Op, &'static str)> {
        let next = self.peek_at(1);
        let (op, written) = match (self.peek()?, next) {
            ('=', Some('=')) => (Op::Eq, "=="),
            ('=', _) => (Op::Eq, "="),
            ('!', Some('=')) => (Op::Ne, "!="),
            ('<', Some('>')) => (Op::Ne, "<>"),
            ('<', Some('=')) => (Op::Le, "<="),
            ('<', _) => (Op::Lt, "<"),
            ('>', Some('=')) => (Op::Ge, ">="),
            ('>', _) => (Op::Gt, ">"),
            _ => return None,
        };
        self.pos += written.len();
        Some((op, written))
    }

    /// The value at the cursor, unquoted and unescaped.
    fn value(&mut self, column: Column, op: &str) -> Result<String, FilterError> {
        match self.peek() {
            None => fail(format!(
                "missing value after '{} {op}' at position {}",
                column.api_name(),
                self.position()
            )),
            Some(quote) if is_quote(quote) => {
                let start = self.position();
                self.pos += 1;
                let mut out = String::new();
                loop {
                    match self.peek() {
                        None => {
                            return fail(format!(
                                "unterminated string starting at position {start}"
                            ))
                        }
                        Some('\\') => match self.peek_at(1) {
                            Some(c @ ('\\' | '"' | '\'')) => {
                                out.push(c);
                                self.pos += 2;
                            }
                            _ => {
                                out.push('\\');
                                self.pos += 1;
                            }
                        },
                        Some(c) if c == quote => {
                            self.pos += 1;
                            return Ok(out);
                        }
                        Some(c) => {
                            out.push(c);
                            self.pos += 1;
                        }
                    }
                }
            }
            Some(_) => Ok(self.take_while(|c| !c.is_whitespace() && !is_quote(c))),
        }
    }
}

/// `raw` as a value of `column`'s type, compared with `op` (spelt `written`).
fn typed(column: Column, op: Op, written: &str, raw: String) -> Result<Value, FilterError> {
    let name = column.api_name();
    let equality_only = |kind: &str| {
        fail(format!(
            "operator '{written}' is not allowed on {kind} column '{name}' (use = or !=)"
        ))
    };
    match column.column_type() {
        ColumnType::Text if matches!(op, Op::Eq | Op::Ne) => Ok(Value::Text(raw)),
        ColumnType::Text => equality_only("text"),
        ColumnType::Bool if !matches!(op, Op::Eq | Op::Ne) => equality_only("boolean"),
        ColumnType::Bool if raw.eq_ignore_ascii_case("true") => Ok(Value::Bool(true)),
        ColumnType::Bool if raw.eq_ignore_ascii_case("false") => Ok(Value::Bool(false)),
        ColumnType::Bool => fail(format!(
            "'{name}' needs true or false, got '{}'",
            shown(&raw)
        )),
        ColumnType::Int => {
            let digits = raw.strip_prefix('-').unwrap_or(&raw);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return fail(format!("'{name}' needs an integer, got '{}'", shown(&raw)));
            }
            match raw.parse::<i64>() {
                Ok(n) => Ok(Value::Int(n)),
                Err(_) => fail(format!(
                    "'{name}' needs an integer, got '{}' (out of range)",
                    shown(&raw)
                )),
            }
        }
        ColumnType::Num => match raw.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Value::Num(x)),
            _ => fail(format!(
                "'{name}' needs a finite number, got '{}'",
                shown(&raw)
            )),
        },
    }
}

/// A number as the canonical form writes it: Rust's shortest round-trip form, in exponent
/// notation when the plain one would be long (1e300 would be 301 digits, over the value limit).
fn number_text(x: f64) -> String {
    let plain = format!("{x}");
    if plain.len() <= 24 {
        plain
    } else {
        format!("{x:e}")
    }
}

impl Filter {
    /// SQL fragment `col op $n AND col op $n+1 ...` (columns and operators from static tables
    /// only, placeholders numbered from `first_param`), plus the values to bind, in order.
    /// An empty filter gives `("1 = 1", vec![])`.
    ///
    /// A `synthetic` term binds [`Value::Int`] 0 or 1, never [`Value::Bool`]: the column is
    /// stored as an INTEGER, so every value returned binds as text, i64 or f64.
    pub fn to_sql(&self, first_param: usize) -> (String, Vec<Value>) {
        if self.terms.is_empty() {
            return ("1 = 1".to_owned(), Vec::new());
        }
        let mut parts = Vec::with_capacity(self.terms.len());
        let mut values = Vec::with_capacity(self.terms.len());
        for (i, term) in self.terms.iter().enumerate() {
            parts.push(format!(
                "{} {} ${}",
                term.column.sql(),
                term.op.sql(),
                first_param.saturating_add(i)
            ));
            values.push(match &term.value {
                Value::Bool(b) => Value::Int(i64::from(*b)),
                other => other.clone(),
            });
        }
        (parts.join(" AND "), values)
    }
}

/// The canonical form: `column op value` joined by ` and `, text values double-quoted (`\"` and
/// `\\` escaped), numbers and booleans bare. Parsing it gives the same filter back, provided it
/// fits in the 1024-character limit (escaping and quoting can make it longer than the input it
/// came from; each term alone always fits).
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            write!(f, "{} {} ", term.column.api_name(), term.op.symbol())?;
            match &term.value {
                Value::Text(s) => {
                    f.write_str("\"")?;
                    for c in s.chars() {
                        if c == '"' || c == '\\' {
                            f.write_str("\\")?;
                        }
                        write!(f, "{c}")?;
                    }
                    f.write_str("\"")?;
                }
                Value::Int(n) => write!(f, "{n}")?,
                Value::Num(x) => f.write_str(&number_text(*x))?,
                Value::Bool(b) => write!(f, "{b}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(column: Column, op: Op, value: &str) -> Term {
        Term {
            column,
            op,
            value: Value::Text(value.to_owned()),
        }
    }

    fn one(input: &str) -> Term {
        let filter = parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(filter.terms.len(), 1, "{input:?}");
        filter.terms[0].clone()
    }

    fn err(input: &str) -> String {
        match parse(input) {
            Ok(f) => panic!("{input:?} parsed as {f:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn round_trips(filter: &Filter) {
        let canonical = filter.to_string();
        assert_eq!(parse(&canonical).as_ref(), Ok(filter), "{canonical:?}");
    }

    #[test]
    fn the_catalogue_example() {
        let f = parse("status = error and toolName = shell").unwrap();
        assert_eq!(
            f.terms,
            vec![
                text(Column::Status, Op::Eq, "error"),
                text(Column::ToolName, Op::Eq, "shell"),
            ]
        );
        assert_eq!(f.to_string(), r#"status = "error" and toolName = "shell""#);
    }

    #[test]
    fn keywords_and_columns_in_any_case() {
        let expected = vec![
            text(Column::Kind, Op::Eq, "tool_result"),
            text(Column::ToolName, Op::Ne, "shell"),
        ];
        for input in [
            "kind = tool_result and toolName != shell",
            "kind = tool_result AND toolName != shell",
            "KIND = tool_result aNd TOOLNAME != shell",
            "kind=tool_result\tAnd\n toolname!=shell",
            "  kind = tool_result   and   toolName != shell  ",
        ] {
            assert_eq!(parse(input).unwrap().terms, expected, "{input:?}");
        }
    }

    #[test]
    fn every_operator_spelling() {
        for (input, op) in [
            ("ts = 5", Op::Eq),
            ("ts == 5", Op::Eq),
            ("ts != 5", Op::Ne),
            ("ts <> 5", Op::Ne),
            ("ts < 5", Op::Lt),
            ("ts > 5", Op::Gt),
            ("ts <= 5", Op::Le),
            ("ts >= 5", Op::Ge),
            ("ts<=5", Op::Le),
            ("ts<>5", Op::Ne),
            ("ts==5", Op::Eq),
            ("ts>5", Op::Gt),
        ] {
            assert_eq!(
                one(input),
                Term {
                    column: Column::Ts,
                    op,
                    value: Value::Int(5)
                },
                "{input:?}"
            );
        }
    }

    #[test]
    fn every_column_maps_to_its_sql_name() {
        let text_columns = [
            ("kind", Column::Kind, "kind"),
            ("sessionKey", Column::SessionKey, "session_key"),
            ("chatId", Column::ChatId, "chat_id"),
            ("messageId", Column::MessageId, "message_id"),
            ("traceId", Column::TraceId, "trace_id"),
            ("agentId", Column::AgentId, "agent_id"),
            ("channel", Column::Channel, "channel"),
            ("toolName", Column::ToolName, "tool_name"),
            ("status", Column::Status, "status"),
            ("finishReason", Column::FinishReason, "finish_reason"),
            ("errorKind", Column::ErrorKind, "error_kind"),
        ];
        for (name, column, sql) in text_columns {
            assert_eq!(one(&format!("{name} = x")), text(column, Op::Eq, "x"));
            assert_eq!((column.api_name(), column.sql()), (name, sql));
        }
        for (name, column, sql) in [
            ("seq", Column::Seq, "seq"),
            ("ts", Column::Ts, "ts"),
            ("durationMs", Column::DurationMs, "duration_ms"),
            ("tokens", Column::Tokens, "tokens"),
        ] {
            assert_eq!(one(&format!("{name} >= -3")).value, Value::Int(-3));
            assert_eq!(one(&format!("{name} >= -3")).column, column);
            assert_eq!((column.api_name(), column.sql()), (name, sql));
        }
        assert_eq!(one("costUsd < 0.5").value, Value::Num(0.5));
        assert_eq!(Column::CostUsd.sql(), "cost_usd");
        assert_eq!(one("synthetic = true").value, Value::Bool(true));
        assert_eq!(Column::Synthetic.sql(), "synthetic");
        assert_eq!(COLUMNS.len(), 17);
    }

    #[test]
    fn bare_values() {
        assert_eq!(
            one("sessionKey = agent:main:telegram/123#x-y.z_w"),
            text(
                Column::SessionKey,
                Op::Eq,
                "agent:main:telegram/123#x-y.z_w"
            )
        );
        // A number on a text column is text.
        assert_eq!(one("chatId = 123"), text(Column::ChatId, Op::Eq, "123"));
        assert_eq!(one("kind=and"), text(Column::Kind, Op::Eq, "and"));
        assert_eq!(one("kind = a=b"), text(Column::Kind, Op::Eq, "a=b"));
        assert_eq!(one("agentId = élan"), text(Column::AgentId, Op::Eq, "élan"));
    }

    #[test]
    fn quoted_values_and_escapes() {
        for (input, value) in [
            (r#"kind = "tool result""#, "tool result"),
            (r#"kind = 'tool result'"#, "tool result"),
            (r#"kind = "a \"b\" c""#, r#"a "b" c"#),
            (r#"kind = 'it\'s'"#, "it's"),
            (r#"kind = 'say "hi"'"#, r#"say "hi""#),
            (r#"kind = "it's""#, "it's"),
            (r#"kind = "back\\slash""#, r"back\slash"),
            (r#"kind = "C:\dir\n""#, r"C:\dir\n"),
            (r#"kind = "a and b""#, "a and b"),
            (r#"kind = """#, ""),
            (r#"kind = ''"#, ""),
            (r#"kind="""#, ""),
            ("kind = \"日本語 😀\"", "日本語 😀"),
        ] {
            assert_eq!(one(input), text(Column::Kind, Op::Eq, value), "{input:?}");
        }
        let f = parse(r#"kind = "" and status = '' and toolName = "x""#).unwrap();
        assert_eq!(f.terms.len(), 3);
        assert_eq!(f.terms[1], text(Column::Status, Op::Eq, ""));
    }

    #[test]
    fn typed_values() {
        assert_eq!(one("seq = 0").value, Value::Int(0));
        assert_eq!(
            one("ts > 1700000000000").value,
            Value::Int(1_700_000_000_000)
        );
        assert_eq!(
            one("tokens >= -9223372036854775808").value,
            Value::Int(i64::MIN)
        );
        assert_eq!(one("durationMs < \"250\"").value, Value::Int(250));
        assert_eq!(one("costUsd >= 1").value, Value::Num(1.0));
        assert_eq!(one("costUsd >= -0.25").value, Value::Num(-0.25));
        assert_eq!(one("costUsd >= 1e-3").value, Value::Num(0.001));
        assert_eq!(one("synthetic != FALSE").value, Value::Bool(false));
        assert_eq!(one("synthetic = True").value, Value::Bool(true));
        assert_eq!(one("synthetic <> true").op, Op::Ne);
    }

    #[test]
    fn unknown_columns() {
        let e = err("foo = 1");
        assert!(
            e.starts_with("unknown column 'foo' (columns: kind, sessionKey, chatId, "),
            "{e}"
        );
        assert!(e.ends_with("costUsd, synthetic)"), "{e}");
        assert!(err("tool_name = shell").starts_with("unknown column 'tool_name'"));
        assert!(err("a.b=1").starts_with("unknown column 'a.b'"));
        let long = format!("{} = 1", "x".repeat(500));
        assert!(err(&long).contains(&format!("'{}...'", "x".repeat(64))));
    }

    #[test]
    fn type_errors() {
        assert_eq!(
            err("durationMs > abc"),
            "'durationMs' needs an integer, got 'abc'"
        );
        assert_eq!(err("seq = 1.5"), "'seq' needs an integer, got '1.5'");
        assert_eq!(err("seq = +1"), "'seq' needs an integer, got '+1'");
        assert_eq!(err("seq = -"), "'seq' needs an integer, got '-'");
        assert_eq!(err("seq = ''"), "'seq' needs an integer, got ''");
        assert_eq!(
            err("tokens = 9223372036854775808"),
            "'tokens' needs an integer, got '9223372036854775808' (out of range)"
        );
        assert_eq!(
            err("costUsd > x"),
            "'costUsd' needs a finite number, got 'x'"
        );
        assert_eq!(
            err("costUsd > inf"),
            "'costUsd' needs a finite number, got 'inf'"
        );
        assert_eq!(
            err("costUsd > NaN"),
            "'costUsd' needs a finite number, got 'NaN'"
        );
        assert_eq!(
            err("costUsd > 1e400"),
            "'costUsd' needs a finite number, got '1e400'"
        );
        assert_eq!(
            err("synthetic = yes"),
            "'synthetic' needs true or false, got 'yes'"
        );
        assert_eq!(
            err("toolName < shell"),
            "operator '<' is not allowed on text column 'toolName' (use = or !=)"
        );
        assert_eq!(
            err("kind >= a"),
            "operator '>=' is not allowed on text column 'kind' (use = or !=)"
        );
        assert_eq!(
            err("synthetic > false"),
            "operator '>' is not allowed on boolean column 'synthetic' (use = or !=)"
        );
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(err(""), "empty expression");
        assert_eq!(err(" \t\n "), "empty expression");
        assert_eq!(
            err(r#"kind = "abc and ts = 1"#),
            "unterminated string starting at position 8"
        );
        assert_eq!(
            err(r#"kind = tool_result and status = "x\""#),
            "unterminated string starting at position 33"
        );
        assert_eq!(
            err("kind = 'x"),
            "unterminated string starting at position 8"
        );
        assert_eq!(
            err("kind = a ts = 1"),
            "expected 'and' after term 1 at position 10"
        );
        assert_eq!(
            err("kind = a or ts = 1"),
            "expected 'and' after term 1 at position 10"
        );
        assert_eq!(
            err("kind = \"a\"and ts = 1"),
            "expected 'and' after term 1 at position 11"
        );
        assert_eq!(
            err("kind = a andts = 1"),
            "expected 'and' after term 1 at position 10"
        );
        assert_eq!(
            err("kind = 'a''b'"),
            "expected 'and' after term 1 at position 11"
        );
        assert_eq!(
            err("kind = a and ts = 1 ts = 2"),
            "expected 'and' after term 2 at position 21"
        );
        assert_eq!(
            err("kind = a and"),
            "expected a term after 'and' at position 13"
        );
        assert_eq!(
            err("kind = a AND   "),
            "expected a term after 'and' at position 16"
        );
        assert_eq!(
            err("kind"),
            "expected an operator (=, !=, <, >, <=, >=) after 'kind' at position 5"
        );
        assert_eq!(
            err("kind ~ a"),
            "expected an operator (=, !=, <, >, <=, >=) after 'kind' at position 6"
        );
        assert_eq!(err("kind = "), "missing value after 'kind =' at position 8");
        assert_eq!(err("ts <>"), "missing value after 'ts <>' at position 6");
        assert_eq!(err("= 5"), "expected a column name in term 1 at position 1");
        assert_eq!(
            err("kind = a and 'x' = 1"),
            "expected a column name in term 2 at position 14"
        );
        assert!(err("and kind = a").starts_with("unknown column 'and'"));
        assert!(err("kind = a and and ts = 1").starts_with("unknown column 'and'"));
    }

    #[test]
    fn limits() {
        let terms = |n: usize| vec!["seq >= 1"; n].join(" and ");
        assert_eq!(parse(&terms(16)).unwrap().terms.len(), 16);
        assert_eq!(err(&terms(17)), "too many terms (at most 16)");

        let value = |n: usize| format!("kind = \"{}\"", "v".repeat(n));
        assert_eq!(one(&value(256)).value, Value::Text("v".repeat(256)));
        assert_eq!(
            err(&value(257)),
            "value of 'kind' in term 1 is too long: 257 characters (at most 256)"
        );
        // Characters, not bytes; escapes count once.
        assert_eq!(
            one(&format!("kind = {}", "é".repeat(256))).value,
            Value::Text("é".repeat(256))
        );
        assert!(parse(&format!("kind = '{}'", "\\'".repeat(256))).is_ok());
        assert!(parse(&format!("kind = '{}'", "\\'".repeat(257))).is_err());

        // Exactly 1024 characters (multi-byte ones included) parse; 1025 do not.
        let padded = |n: usize| {
            let head = "kind = a and status = b and toolName = ";
            let rest = n - head.chars().count() - 2;
            format!("{head}'{}'", "ü".repeat(rest.min(256))) + &" ".repeat(rest.saturating_sub(256))
        };
        let ok = padded(1024);
        assert_eq!(ok.chars().count(), 1024);
        assert_eq!(parse(&ok).unwrap().terms.len(), 3);
        let long = padded(1025);
        assert_eq!(
            err(&long),
            "expression too long: 1025 characters (at most 1024)"
        );
        assert!(err(&"x".repeat(1_000_000)).starts_with("expression too long"));
    }

    #[test]
    fn to_sql_binds_every_value() {
        let f = parse("kind = tool_result and durationMs >= 500 and synthetic = false").unwrap();
        let (sql, values) = f.to_sql(4);
        assert_eq!(sql, "kind = $4 AND duration_ms >= $5 AND synthetic = $6");
        assert_eq!(
            values,
            vec![
                Value::Text("tool_result".into()),
                Value::Int(500),
                Value::Int(0)
            ]
        );
        let (sql, values) = parse(
            "synthetic != true and costUsd < 0.1 and chatId <> \"'; DROP TABLE trace_rows; --\"",
        )
        .unwrap()
        .to_sql(1);
        assert_eq!(sql, "synthetic <> $1 AND cost_usd < $2 AND chat_id <> $3");
        assert_eq!(
            values,
            vec![
                Value::Int(1),
                Value::Num(0.1),
                Value::Text("'; DROP TABLE trace_rows; --".into())
            ]
        );
        assert_eq!(Filter::default().to_sql(1), ("1 = 1".to_owned(), vec![]));
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        let f = parse(
            r#"KIND == 'say "hi"' AND seq<>-4 and costUsd>=5 and synthetic = TRUE and toolName != 'a\\b'"#,
        )
        .unwrap();
        assert_eq!(
            f.to_string(),
            r#"kind = "say \"hi\"" and seq != -4 and costUsd >= 5 and synthetic = true and toolName != "a\\b""#
        );
        round_trips(&f);
        for input in [
            "status = error and toolName = shell",
            r#"kind = "" and chatId = 'x\'y' and messageId = "\\\"""#,
            "costUsd < 0.1 and costUsd > 1e300 and costUsd != 5e-324 and costUsd = -0",
            "costUsd = 123456789012345678901234567890",
            "ts >= -9223372036854775808 and ts <= 9223372036854775807",
            "agentId = 日本語 and channel = \"tab\there\" and traceId = C:\\x\\",
        ] {
            round_trips(&parse(input).unwrap());
        }
        // Long numbers switch to exponent notation to stay under the value limit.
        let big = parse("costUsd > 1e300").unwrap();
        assert_eq!(big.to_string(), "costUsd > 1e300");
        let quoted = parse(&format!("kind = '{}'", "\"".repeat(256))).unwrap();
        round_trips(&quoted);
    }

    /// A tiny LCG (no dependency): the same strings on every run.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) as usize % n
        }

        fn pick(&mut self, list: &[&'static str]) -> &'static str {
            list[self.below(list.len())]
        }
    }

    #[test]
    fn parse_never_panics_on_random_strings() {
        const PIECES: &[&str] = &[
            "kind",
            "toolName",
            "ts",
            "costUsd",
            "synthetic",
            "seq",
            " ",
            "  ",
            "\t",
            "and",
            "AND",
            " and ",
            "=",
            "==",
            "!=",
            "<>",
            "<",
            ">",
            "<=",
            ">=",
            "!",
            "\"",
            "'",
            "\\",
            "\\\"",
            "1",
            "-",
            "0.5",
            "e",
            "true",
            "false",
            "x",
            ":",
            "#",
            "é",
            "😀",
            "日",
            "\u{301}",
            "\u{a0}",
            "\u{2028}",
            "\0",
        ];
        const ANY_OP: &[&str] = &["=", "==", "!=", "<>", "<", ">", "<=", ">="];
        const EQ_OP: &[&str] = &["=", "==", "!=", "<>"];
        // Column spellings with the operators and values they take (and one they do not).
        const SHAPES: &[(&[&str], &[&str], &[&str])] = &[
            (
                &["kind", "TOOLNAME", "sessionkey"],
                EQ_OP,
                &[
                    "shell",
                    r#""a \" b""#,
                    "'é 😀'",
                    "''",
                    "a:b/c#d",
                    r#""\\""#,
                    "12",
                    "<",
                ],
            ),
            (&["ts", "sEq"], ANY_OP, &["1", "-7", "\"42\"", "1.5"]),
            (
                &["costUsd"],
                ANY_OP,
                &["0.5", "1e300", "-3", "5e-324", "nan"],
            ),
            (&["synthetic"], EQ_OP, &["true", "FALSE", "'true'", "1"]),
        ];
        const JOINS: &[&str] = &[" and ", " AND ", "\tAnd\n", " and ", " and", " or "];
        let mut rng = Lcg(0x5eed);
        let mut parsed = 0;
        for round in 0..1000 {
            let mut input = String::new();
            if round % 2 == 0 {
                // Terms of the language, then a few random pieces spliced in.
                let terms = [1, 1, 2, 3, 4, 16, 17][rng.below(7)];
                for i in 0..terms {
                    if i > 0 {
                        input.push_str(rng.pick(JOINS));
                    }
                    let (names, ops, values) = SHAPES[rng.below(SHAPES.len())];
                    input.push_str(rng.pick(names));
                    input.push_str(rng.pick(&["", " "]));
                    input.push_str(rng.pick(ops));
                    input.push_str(rng.pick(&["", " "]));
                    input.push_str(rng.pick(values));
                }
                let mut chars: Vec<char> = input.chars().collect();
                for _ in 0..[0, 0, 0, 1, 2][rng.below(5)] {
                    let at = rng.below(chars.len() + 1);
                    let piece = rng.pick(PIECES);
                    chars.splice(at..at, piece.chars());
                }
                input = chars.into_iter().collect();
            } else {
                for _ in 0..rng.below(24) {
                    input.push_str(rng.pick(PIECES));
                }
            }
            if let Ok(f) = parse(&input) {
                parsed += 1;
                assert!((1..=MAX_TERMS).contains(&f.terms.len()), "{input:?}");
                let (sql, values) = f.to_sql(1);
                assert_eq!(sql.matches('$').count(), values.len(), "{input:?}");
                round_trips(&f);
            }
        }
        assert!(parsed > 100, "only {parsed} of 1000 random strings parsed");
    }
}
