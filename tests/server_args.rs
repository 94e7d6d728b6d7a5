//! The llama-server option table follows the pinned llama.cpp: every option
//! `common/arg.cpp` offers to llama-server must be known to pipeshard-server.

use pipeshard::server::upstream_args::UPSTREAM_OPTS;

#[test]
fn every_upstream_server_option_is_known() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/vendor/llama.cpp/common/arg.cpp");
    let src = std::fs::read_to_string(path).expect("vendor/llama.cpp/common/arg.cpp (created by the build)");
    let known: Vec<&str> = UPSTREAM_OPTS
        .iter()
        .flat_map(|o| o.names.iter().chain(o.negated.iter()))
        .copied()
        .collect();
    let blocks: Vec<&str> = src.split("add_opt(common_arg(").skip(1).collect();
    assert!(blocks.len() > 200, "arg.cpp looks different: {} options", blocks.len());
    let mut missing = Vec::new();
    let mut checked = 0;
    for b in blocks {
        let b = b.split("add_opt(").next().unwrap_or(b);
        let examples = b
            .split(".set_examples({")
            .nth(1)
            .map(|r| r.split('}').next().unwrap_or(""));
        let excludes = b
            .split(".set_excludes({")
            .nth(1)
            .map(|r| r.split('}').next().unwrap_or(""));
        let for_server = examples.map_or(true, |e| {
            e.contains("LLAMA_EXAMPLE_SERVER") || e.contains("LLAMA_EXAMPLE_COMMON")
        }) && !excludes.is_some_and(|e| e.contains("LLAMA_EXAMPLE_SERVER"));
        if !for_server {
            continue;
        }
        let Some(open) = b.find('{') else { continue };
        let Some(close) = b[open..].find('}') else {
            continue;
        };
        for name in b[open + 1..open + close].split(',') {
            let name = name.trim().trim_matches('"');
            if name.starts_with('-') {
                checked += 1;
                if !known.contains(&name) {
                    missing.push(name.to_string());
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} names checked");
    assert!(
        missing.is_empty(),
        "llama-server options missing from src/server/upstream_args.rs: {missing:?}"
    );
}
