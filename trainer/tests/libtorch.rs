//! The binary links the PyTorch 2.11.0 libtorch and computes correctly on CPU.

use std::process::Command;

#[test]
fn bf16_matmul_is_exact_on_cpu() {
    assert!(trainer::torch_info::matmul_check(tch::Device::Cpu).unwrap());
}

#[test]
fn info_reports_the_build() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).arg("info").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["devices"][0]["device"], "Cpu");
    assert_eq!(info["devices"][0]["bf16MatmulOk"], true);
    assert_eq!(info["cudaFeature"], cfg!(feature = "cuda"));
}

#[test]
fn presets_json_matches_the_api_crate() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).args(["presets", "--json"]).output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), crds::presets::PRESETS.len());
    let ml = lines.iter().find(|l| l["preset"] == "medium-large").unwrap();
    assert_eq!(ml["params_without_norms"], 401_227_776u64);
}

#[test]
fn resolve_prints_the_run_config() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed001-xlarge-4x2a100.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).args(["resolve", manifest]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c: crds::RunConfig = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((c.topology.world_size, c.batch.grad_accum), (8, 2));
}

#[test]
fn invalid_manifest_exits_with_the_invalid_config_code_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("trainer-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/tiny-local.yaml")).unwrap();
    std::fs::write(&path, good.replace("globalTokens: 8192", "globalTokens: 8000")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).arg("resolve").arg(&path).output().unwrap();
    let code = crds::contract::FailureReason::InvalidConfig.exit_code();
    assert_eq!(out.status.code(), Some(code));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml") && stderr.contains("spec.batch.globalTokens"), "{stderr}");
    std::fs::write(&path, good.replace("microBatch: 8", "microBatch: 8\n    microbatch: 4")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).arg("resolve").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(code));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field spec.batch.microbatch"));
    std::fs::remove_dir_all(&dir).unwrap();
}
