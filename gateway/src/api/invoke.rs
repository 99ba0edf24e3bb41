//! What the generated dispatch calls: scope check, typed params (validated against the
//! method's JSON Schema), and result encoding.

use std::sync::{LazyLock, OnceLock};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::generated::methods::{error_codes, MethodInfo, METHODS};
use super::{CallContext, RpcError};

/// Schema problems named in one -32602 message, at most.
const MAX_REPORTED: usize = 5;
/// Each problem's text is cut here so that large values are not echoed back whole.
const MAX_PROBLEM_LEN: usize = 240;

static VALIDATORS: LazyLock<Vec<OnceLock<Option<jsonschema::Validator>>>> =
    LazyLock::new(|| METHODS.iter().map(|_| OnceLock::new()).collect());

/// The compiled params validator of a method (compiled on first use).
fn validator(info: &MethodInfo) -> Option<&'static jsonschema::Validator> {
    let slot = VALIDATORS.get(info.id as usize)?;
    slot.get_or_init(|| {
        let schema: Value = serde_json::from_str(info.params_schema).ok()?;
        match jsonschema::validator_for(&schema) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(method = info.name, error = %e, "params schema does not compile");
                None
            }
        }
    })
    .as_ref()
}

/// -32603 `Insufficient scope` unless the caller holds the method's scope.
pub fn authorize(ctx: &CallContext, info: &MethodInfo) -> Result<(), RpcError> {
    if ctx.allows(info.scope) {
        Ok(())
    } else {
        Err(RpcError::insufficient_scope(info.scope))
    }
}

/// The ownership rule of the method, for the record its params name (`named`; None when the
/// param is absent): -32001 `<Kind> not found: <id>` unless the caller's tenant reaches it, the
/// same answer as a record that does not exist; for a kind that refuses as scope (a tenant id
/// the memory methods take), -32603 `Insufficient scope: requires 'admin'`.
pub async fn check_owner<O: crate::api::tenancy::Owners>(
    owners: &O,
    ctx: &CallContext,
    info: &MethodInfo,
    named: Option<&str>,
) -> Result<(), RpcError> {
    let (Some(rule), Some(id)) = (&info.owner, named) else {
        return Ok(());
    };
    if crate::api::tenancy::allowed(owners, ctx.tenant(), rule.kind, rule.claim, id).await? {
        return Ok(());
    }
    if rule.kind.refuse_as_scope() {
        return Err(RpcError::insufficient_scope(
            super::generated::methods::Scope::Admin,
        ));
    }
    let shown: String = id.chars().take(200).filter(|c| !c.is_control()).collect();
    Err(RpcError::new(
        error_codes::NOT_FOUND,
        format!("{}: {shown}", rule.kind.not_found()),
    ))
}

/// Validates `params` (absent = `{}`) against the schema, then decodes the typed struct.
pub fn parse_params<T: DeserializeOwned>(
    info: &MethodInfo,
    params: Option<Value>,
) -> Result<T, RpcError> {
    let params = params.unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    let Some(validator) = validator(info) else {
        return Err(RpcError::internal());
    };
    let problems: Vec<String> = validator
        .iter_errors(&params)
        .take(MAX_REPORTED)
        .map(|e| {
            let path = e.instance_path().to_string();
            let at = if path.is_empty() {
                "params".to_owned()
            } else {
                format!("'{}'", path.trim_start_matches('/').replace('/', "."))
            };
            let mut text = format!("{at}: {e}");
            if text.len() > MAX_PROBLEM_LEN {
                let cut = (0..=MAX_PROBLEM_LEN)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                text.truncate(cut);
                text.push('…');
            }
            text
        })
        .collect();
    if !problems.is_empty() {
        return Err(RpcError::invalid_params(problems.join("; ")));
    }
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        RpcError::invalid_params(format!("'{path}': {}", e.into_inner()))
    })
}

/// Serializes a typed result.
pub fn encode_result<T: Serialize>(result: &T) -> Result<Value, RpcError> {
    serde_json::to_value(result).map_err(|e| {
        tracing::error!(error = %e, "result does not serialize");
        RpcError::internal()
    })
}
