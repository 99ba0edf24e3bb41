//! One JSON Schema file per method params and result, under `generated/jsonschema/`.

use crate::emit::{pretty, schema::SchemaBuilder};
use crate::ir::Catalogue;

pub fn emit(cat: &Catalogue) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for m in &cat.methods {
        let params = SchemaBuilder::new(cat, "#/$defs/").params_root(m);
        let result = SchemaBuilder::new(cat, "#/$defs/").result_root(m);
        out.push((format!("{}.params.json", m.name), pretty(&params)?));
        out.push((format!("{}.result.json", m.name), pretty(&result)?));
    }
    Ok(out)
}
