//! The codegen CLI: `generate` rewrites generated/, `check` fails when it is stale,
//! `check-catalogue` only validates the catalogue.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str =
    "usage: gateway-codegen <generate | check | check-catalogue> [--catalogue DIR] [--out DIR]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut catalogue = root.join("catalogue");
    let mut out = root.join("generated");
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--catalogue", Some(v)) => catalogue = PathBuf::from(v),
            ("--out", Some(v)) => out = PathBuf::from(v),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let cat = match gateway_codegen::load_catalogue(&catalogue) {
        Ok(c) => c,
        Err(problems) => {
            eprint!("{problems}");
            return ExitCode::FAILURE;
        }
    };
    match command.as_str() {
        "check-catalogue" => {
            println!(
                "catalogue ok: {} methods in {} namespaces, {} types",
                cat.methods.len(),
                cat.namespaces.len(),
                cat.types.len()
            );
            ExitCode::SUCCESS
        }
        "generate" => match gateway_codegen::generate(&cat, &out) {
            Ok(n) => {
                println!(
                    "generated/: {n} file(s) written ({} methods)",
                    cat.methods.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("generate failed: {e}");
                ExitCode::FAILURE
            }
        },
        "check" => match gateway_codegen::check(&cat, &out) {
            Ok(diffs) if diffs.is_empty() => {
                println!("generated/ is up to date");
                ExitCode::SUCCESS
            }
            Ok(diffs) => {
                for d in &diffs {
                    eprintln!("{d}");
                }
                eprintln!("generated/ is stale: run `cargo run -p gateway-codegen -- generate`");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("check failed: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
