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
        let path = out.join(&name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("cannot write {}: {e}", path.display());
                std::process::exit(1);
            }
        }
    }
}
