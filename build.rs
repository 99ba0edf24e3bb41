//! catalogue/ -> OUT_DIR/{types,methods,handlers,dispatch}.rs through gateway-codegen.
//! A malformed catalogue fails the build with every problem listed.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let catalogue = root.join("catalogue");
    println!("cargo:rerun-if-changed={}", catalogue.display());
    // sqlx::migrate! embeds these at compile time.
    println!(
        "cargo:rerun-if-changed={}",
        root.join("gateway/migrations").display()
    );
    for f in gateway_codegen::load::files(&catalogue) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    let cat = match gateway_codegen::load_catalogue(&catalogue) {
        Ok(c) => c,
        Err(problems) => {
            for line in problems.to_string().lines() {
                println!("cargo:warning={line}");
            }
            eprint!("{problems}");
            std::process::exit(1);
        }
    };
    let files = match gateway_codegen::render_rust(&cat) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("code generation failed: {e}");
            std::process::exit(1);
        }
    };
    for (name, text) in files {
        write_if_changed(&out.join(&name), &text);
    }
    contract_docs(&cat, &out);
}

fn write_if_changed(path: &std::path::Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// The OpenRPC document and the HTML method pages the server embeds, rendered here from the
/// catalogue (the same renderers as `generated/`, which the drift test keeps equal), plus
/// `contract_docs.rs` listing them for `include_str!`.
fn contract_docs(cat: &gateway_codegen::Catalogue, out: &std::path::Path) {
    let dir = out.join("contract");
    let pages_dir = dir.join("docs");
    if let Err(e) = std::fs::create_dir_all(&pages_dir) {
        eprintln!("cannot create {}: {e}", pages_dir.display());
        std::process::exit(1);
    }
    let rendered =
        gateway_codegen::emit::openrpc::emit(cat, gateway_codegen::VERSION).and_then(|doc| {
            Ok((
                doc,
                gateway_codegen::emit::html::emit(cat, gateway_codegen::VERSION)?,
            ))
        });
    let (openrpc, pages) = match rendered {
        Ok(r) => r,
        Err(e) => {
            eprintln!("contract documents failed: {e}");
            std::process::exit(1);
        }
    };
    write_if_changed(&dir.join("openrpc.json"), &openrpc);
    let mut index = String::from(
        "/// `generated/openrpc.json`, as rendered from the catalogue at build time.\n\
         pub static OPENRPC_JSON: &str = include_str!(concat!(env!(\"OUT_DIR\"), \"/contract/openrpc.json\"));\n\
         /// `generated/docs/<file>`: the JSON-RPC method pages, sorted by file name.\n\
         pub static RPC_PAGES: &[(&str, &str)] = &[\n",
    );
    for (name, text) in &pages {
        write_if_changed(&pages_dir.join(name), text);
        index.push_str(&format!(
            "    ({name:?}, include_str!(concat!(env!(\"OUT_DIR\"), {:?}))),\n",
            format!("/contract/docs/{name}")
        ));
    }
    index.push_str("];\n");
    write_if_changed(&out.join("contract_docs.rs"), &index);
}
