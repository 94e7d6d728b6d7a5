//! A representative part of llama.cpp's own server tests
//! (`tools/server/tests/unit`, non-slow) against `pipeshard-server`, through
//! `scripts/server-tests.sh` with local models. The tests listed in
//! `tests/upstream-server/expected-failures.txt` need upstream's own test
//! models (or the network) and are left out; every other failure is a real
//! incompatibility. The whole suite runs with `scripts/server-tests.sh`;
//! `docs/upstream-server-tests.md` has its results.

use std::process::Command;

/// The files run here: the chat, completion, Anthropic and OpenAI-responses
/// APIs, templates and tool calls, tokenization, security, speculative
/// decoding, sleep, MCP and built-in tools; 187 tests, about 80 s on two cores.
const FILES: &[&str] = &[
    "unit/test_basic.py",
    "unit/test_chat_completion.py",
    "unit/test_compat_anthropic.py",
    "unit/test_compat_gcp.py",
    "unit/test_compat_oai_responses.py",
    "unit/test_ignore_eos.py",
    "unit/test_infill.py",
    "unit/test_kv_keep_only_active.py",
    "unit/test_mcp_servers.py",
    "unit/test_security.py",
    "unit/test_sleep.py",
    "unit/test_speculative.py",
    "unit/test_template.py",
    "unit/test_tokenize.py",
    "unit/test_tool_call.py",
    "unit/test_tools_builtin.py",
];

#[test]
fn upstream_server_tests_pass_with_local_models() {
    let root = env!("CARGO_MANIFEST_DIR");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_pipeshard-server"))
        .parent()
        .unwrap();
    let out = Command::new(format!("{root}/scripts/server-tests.sh"))
        .args(["-m", "not slow"])
        .args(FILES)
        .env("PIPESHARD_SERVER_TESTS_SKIP_EXPECTED", "1")
        .env("PIPESHARD_BIN_DIR", bin_dir)
        .env_remove("LLAMA_SERVER_BIN_PATH")
        .output()
        .expect("running scripts/server-tests.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("FAILED") || l.starts_with("ERROR") || l.contains(" passed"))
        .collect();
    eprintln!("{}", summary.join("\n"));
    assert!(
        out.status.success(),
        "upstream's server tests failed against pipeshard-server:\n{}\n{}",
        &stdout[stdout.len().saturating_sub(20000)..],
        String::from_utf8_lossy(&out.stderr)
    );
}
