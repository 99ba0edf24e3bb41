//! The workspace file methods from outside (issue 31): listDir, readFile, writeFile and
//! deleteFile on a real gateway, byte-exact round trips, every path refusal (absolute, `..`,
//! `.git`, private paths, NUL, backslash), symbolic links planted in the workspace (to /etc, to
//! a file inside) never followed, the size limits at and past the bound, scopes, and a missing
//! agent, file or directory.

use std::path::PathBuf;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::common::*;

const CONFIG: &str = r#"providers:
  script:
    type: scripted
    models: [m1]
    script: []
agents:
  default: {model: script/m1}
  other: {model: script/m1}
"#;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn workspace(gw: &Gateway, agent: &str) -> PathBuf {
    gw.dir.path().join("data").join("workspaces").join(agent)
}

async fn call(gw: &Gateway, token: &str, method: &str, params: Value) -> Value {
    gw.call(token, method, params).await
}

/// The code of a refused call, after checking its message names `part`.
async fn refused(gw: &Gateway, token: &str, method: &str, params: Value, part: &str) -> i64 {
    let v = call(gw, token, method, params).await;
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not refused: {v}"));
    assert!(
        message.contains(part),
        "{method}: message lacks {part:?}: {v}"
    );
    code(&v)
}

#[tokio::test]
async fn files_round_trip_byte_exact_and_directories_list_without_git() {
    let gw = start(CONFIG).await;
    let w = ok(
        &gw,
        ADMIN,
        "workspace.writeFile",
        json!({"agentId": "default", "filePath": "notes/today.md", "content": "héllo\n"}),
    )
    .await;
    assert_eq!(
        w,
        json!({"written": true, "filePath": "notes/today.md", "sizeBytes": 7})
    );
    let r = ok(
        &gw,
        RPC,
        "workspace.readFile",
        json!({"agentId": "default", "filePath": "notes/today.md"}),
    )
    .await;
    assert_eq!(
        (&r["content"], &r["encoding"], &r["sizeBytes"]),
        (&json!("héllo\n"), &json!("utf8"), &json!(7))
    );
    assert!(r["modifiedAt"].as_i64().unwrap() > 1_700_000_000_000, "{r}");

    // Every byte value, through base64 both ways; the file on disk is exactly those bytes.
    let all: Vec<u8> = (0..=255u8).collect();
    ok(
        &gw,
        ADMIN,
        "workspace.writeFile",
        json!({"agentId": "default", "filePath": "bin/all.bin", "content": B64.encode(&all), "encoding": "base64"}),
    )
    .await;
    assert_eq!(
        std::fs::read(workspace(&gw, "default").join("bin/all.bin")).unwrap(),
        all
    );
    let r = ok(
        &gw,
        RPC,
        "workspace.readFile",
        json!({"agentId": "default", "filePath": "bin/all.bin"}),
    )
    .await;
    assert_eq!(r["encoding"], "base64");
    assert_eq!(B64.decode(r["content"].as_str().unwrap()).unwrap(), all);
    assert_eq!(r["sizeBytes"], 256);
    // Replacing is atomic: no temporary file is left beside it.
    ok(
        &gw,
        ADMIN,
        "workspace.writeFile",
        json!({"agentId": "default", "filePath": "bin/all.bin", "content": "x"}),
    )
    .await;

    // .git (made on disk, as git would) is never listed; directories first, then by name.
    let ws = workspace(&gw, "default");
    std::fs::create_dir_all(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]").unwrap();
    std::fs::write(ws.join("AGENTS.md"), "# rules").unwrap();
    let l = ok(&gw, RPC, "workspace.listDir", json!({"agentId": "default"})).await;
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bin", "notes", "AGENTS.md"], "{l}");
    let l = ok(
        &gw,
        RPC,
        "workspace.listDir",
        json!({"agentId": "default", "subdir": "bin"}),
    )
    .await;
    assert_eq!(
        l["entries"],
        json!([{"name": "all.bin", "path": "bin/all.bin", "type": "file", "sizeBytes": 1,
        "modifiedAt": l["entries"][0]["modifiedAt"]}]),
        "{l}"
    );

    let d = ok(
        &gw,
        ADMIN,
        "workspace.deleteFile",
        json!({"agentId": "default", "filePath": "bin/all.bin"}),
    )
    .await;
    assert_eq!(d, json!({"deleted": true, "filePath": "bin/all.bin"}));
    assert!(!ws.join("bin/all.bin").exists());
    gw.stop().await;
}

#[tokio::test]
async fn paths_that_leave_the_workspace_or_reach_private_files_are_refused() {
    let gw = start(CONFIG).await;
    let ws = workspace(&gw, "default");
    std::fs::create_dir_all(ws.join("inside")).unwrap();
    std::fs::write(ws.join("inside/f.txt"), "inside").unwrap();
    std::fs::write(ws.join(".netrc"), "machine x password p").unwrap();
    std::fs::create_dir_all(ws.join("gates")).unwrap();
    std::fs::write(ws.join("gates/check.sh"), "#!/bin/sh").unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("etc")).unwrap();
    std::os::unix::fs::symlink("inside", ws.join("alias")).unwrap();
    std::os::unix::fs::symlink("inside/f.txt", ws.join("f-link")).unwrap();
    let read = |p: &str| json!({"agentId": "default", "filePath": p});
    for (path, part) in [
        ("../outside.txt", "'..'"),
        ("inside/../../x", "'..'"),
        (".git/config", ".git"),
        ("sub/.GIT/HEAD", ".git"),
        ("a\u{0}b", "NUL"),
        ("a\\b", "backslash"),
        ("a//b", "empty segment"),
        (".netrc", "private"),
        ("deep/.netrc", "private"),
        ("gates/check.sh", "private"),
        ("etc/passwd", "symbolic link"),
        ("alias/f.txt", "symbolic link"),
        ("f-link", "symbolic link"),
    ] {
        assert_eq!(
            refused(&gw, RPC, "workspace.readFile", read(path), part).await,
            -32602,
            "{path:?}"
        );
        let w = json!({"agentId": "default", "filePath": path, "content": "x"});
        assert_eq!(
            refused(&gw, ADMIN, "workspace.writeFile", w, part).await,
            -32602,
            "write {path:?}"
        );
    }
    // An absolute path fails the catalogue's own pattern.
    assert_eq!(
        code(&call(&gw, RPC, "workspace.readFile", read("/etc/passwd")).await),
        -32602
    );
    // Nothing was written through the link, and /etc is untouched.
    assert!(!std::path::Path::new("/etc/x").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("inside/f.txt")).unwrap(),
        "inside"
    );
    // The links are listed for what they are; private entries are not listed.
    let l = ok(&gw, RPC, "workspace.listDir", json!({"agentId": "default"})).await;
    let kinds: Vec<(String, String)> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("etc".into(), "symlink".into())),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|(n, _)| n == ".netrc" || n == "gates"),
        "{kinds:?}"
    );
    let sub = json!({"agentId": "default", "subdir": "etc"});
    assert_eq!(
        refused(&gw, RPC, "workspace.listDir", sub, "symbolic link").await,
        -32602
    );
    let del = json!({"agentId": "default", "filePath": "f-link"});
    assert_eq!(
        refused(&gw, ADMIN, "workspace.deleteFile", del, "symbolic link").await,
        -32602
    );
    assert!(
        ws.join("f-link").symlink_metadata().is_ok(),
        "the link stays"
    );
    let del = json!({"agentId": "default", "filePath": "inside"});
    assert_eq!(
        refused(&gw, ADMIN, "workspace.deleteFile", del, "directory").await,
        -32602
    );
    gw.stop().await;
}

#[tokio::test]
async fn missing_things_scopes_and_size_limits() {
    // A body large enough for 1 MiB of content and more.
    let gw = start(&format!("  httpBodyLimitBytes: 4194304\n{CONFIG}")).await;
    // Unknown agent, a workspace not created yet, a missing file and directory: -32001.
    let r = json!({"agentId": "nobody", "filePath": "a.txt"});
    assert_eq!(
        refused(&gw, RPC, "workspace.readFile", r, "nobody").await,
        -32001
    );
    let r = json!({"agentId": "other", "filePath": "a.txt"});
    assert_eq!(
        refused(&gw, RPC, "workspace.readFile", r, "a.txt").await,
        -32001
    );
    ok(
        &gw,
        ADMIN,
        "workspace.writeFile",
        json!({"agentId": "default", "filePath": "a.txt", "content": ""}),
    )
    .await;
    let r = json!({"agentId": "default", "filePath": "b.txt"});
    assert_eq!(
        refused(&gw, RPC, "workspace.readFile", r, "b.txt").await,
        -32001
    );
    let r = json!({"agentId": "default", "subdir": "nope"});
    assert_eq!(
        refused(&gw, RPC, "workspace.listDir", r, "nope").await,
        -32001
    );
    let r = json!({"agentId": "default", "filePath": "b.txt"});
    assert_eq!(
        refused(&gw, ADMIN, "workspace.deleteFile", r, "b.txt").await,
        -32001
    );
    // Writes are admin's; reads are rpc.
    let w = json!({"agentId": "default", "filePath": "a.txt", "content": "x"});
    assert_eq!(
        code(&call(&gw, RPC, "workspace.writeFile", w).await),
        -32603
    );
    let d = json!({"agentId": "default", "filePath": "a.txt"});
    assert_eq!(
        code(&call(&gw, RPC, "workspace.deleteFile", d).await),
        -32603
    );
    // Invalid base64 is -32602 and writes nothing.
    let w =
        json!({"agentId": "default", "filePath": "c.bin", "content": "!!", "encoding": "base64"});
    assert_eq!(
        refused(&gw, ADMIN, "workspace.writeFile", w, "base64").await,
        -32602
    );
    assert!(!workspace(&gw, "default").join("c.bin").exists());
    // Content: 1 MiB of characters at the limit, one more refused.
    let at = "a".repeat(1 << 20);
    ok(
        &gw,
        ADMIN,
        "workspace.writeFile",
        json!({"agentId": "default", "filePath": "big.txt", "content": at}),
    )
    .await;
    let past = "a".repeat((1 << 20) + 1);
    let w = json!({"agentId": "default", "filePath": "big.txt", "content": past});
    assert_eq!(
        code(&call(&gw, ADMIN, "workspace.writeFile", w).await),
        -32602
    );
    // Reads: 10 MiB at the limit, one byte more refused.
    let ws = workspace(&gw, "default");
    std::fs::write(ws.join("ten.bin"), vec![b'x'; 10 << 20]).unwrap();
    let r = ok(
        &gw,
        RPC,
        "workspace.readFile",
        json!({"agentId": "default", "filePath": "ten.bin"}),
    )
    .await;
    assert_eq!(r["sizeBytes"], 10 << 20);
    std::fs::write(ws.join("ten.bin"), vec![b'x'; (10 << 20) + 1]).unwrap();
    let r = json!({"agentId": "default", "filePath": "ten.bin"});
    assert_eq!(
        refused(&gw, RPC, "workspace.readFile", r, "more than").await,
        -32602
    );
    gw.stop().await;
}
