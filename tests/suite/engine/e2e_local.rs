//! A real agent turn on the in-process local model (SmolLM2-135M through candle), end to end
//! over JSON-RPC. Needs the model cache filled by `agent-gateway fetch-models` (the test
//! script does it); it never downloads anything itself.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_turn_on_the_local_model() {
    if std::env::var("AGENT_GATEWAY_SKIP_LOCAL_MODEL").as_deref() == Ok("1") {
        eprintln!("AGENT_GATEWAY_SKIP_LOCAL_MODEL=1: local model test skipped");
        return;
    }
    let gw = start("\nlocal: {autoFetch: false}\nproviders:\n  local: {type: local}\nagents:\n  default: {model: local/smollm2-135m-instruct, systemPrompt: 'Answer in one short sentence.'}\n").await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let m = gw
            .call(ADMIN, "models.list", json!({"provider": "local"}))
            .await;
        let chat = m["result"]["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == "local/smollm2-135m-instruct")
            .cloned()
            .unwrap();
        if chat["available"] == true {
            break;
        }
        if Instant::now() > deadline {
            let r = gw
                .call(RPC, "agent.execute", json!({"message": "hi"}))
                .await;
            panic!("the local model did not load (run `agent-gateway fetch-models`): {r}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let r = gw
        .call(
            RPC,
            "agent.execute",
            json!({"message": "What is the capital of France?", "sessionKey": {"userId": "local"}}),
        )
        .await;
    let result = r.get("result").unwrap_or_else(|| panic!("{r}"));
    validate_result("agent.execute", result);
    assert!(
        !result["response"].as_str().unwrap().trim().is_empty(),
        "{r}"
    );
    assert!(["stop", "max_steps"].contains(&result["finishReason"].as_str().unwrap()));
    assert!(result["tokensUsed"]["input"].as_i64().unwrap() > 0);
    assert!(result["tokensUsed"]["output"].as_i64().unwrap() > 0);
    let h = gw
        .call(
            RPC,
            "session.history",
            json!({"session_key": "agent:default:api:client:local"}),
        )
        .await;
    assert_eq!(
        h["result"]["messages"][1]["model"],
        "local/smollm2-135m-instruct"
    );
    gw.stop().await;
}
