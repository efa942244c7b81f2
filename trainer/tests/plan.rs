//! The memory planner against the trainer: `trainer plan` and the gpuMemory check on
//! the command line, and the planned step peak against libtorch's allocator.

use std::path::Path;
use std::process::Command;

use crds::types::Parallelism;
use trainer::bench::memory::{Hardware, MemoryCase, measure};

fn example(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)).unwrap()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("trainer-plan-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn plan_prints_the_table_and_exits_non_zero_with_remedies_when_the_run_does_not_fit() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed003-llama3-2.2b.yaml");
    let plan = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trainer")).arg("plan").arg(manifest).args(extra).output().unwrap()
    };
    let fits = plan(&[]);
    assert!(fits.status.success(), "{}", String::from_utf8_lossy(&fits.stderr));
    let table = String::from_utf8_lossy(&fits.stdout);
    assert!(table.contains("parallelism zero1") && table.contains("of 48.0 GiB per GPU: fits"), "{table}");

    let small = plan(&["--gpu-memory", "24GiB"]);
    assert_eq!(small.status.code(), Some(crds::contract::FailureReason::InvalidConfig.exit_code()));
    assert!(String::from_utf8_lossy(&small.stdout).contains("does not fit"));
    let why = String::from_utf8_lossy(&small.stderr);
    assert!(
        why.contains("needs 44.0 GiB per GPU, has 24.0 GiB") && why.contains("spec.parallelism: zero2 saves"),
        "{why}"
    );

    let json = plan(&["--json", "--gpu-memory", "80Gi"]);
    assert!(json.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!((v["fits"].as_bool(), v["worldSize"].as_u64()), (Some(true), Some(2)));
    assert!(v["bytesPerRank"]["needed"].as_u64().unwrap() > 40 << 30);

    let bad = plan(&["--gpu-memory", "lots"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--gpu-memory"));
}

/// `trainer run` resolves as the operator does, so it refuses a run planned not to fit
/// its gpuMemory before it loads anything.
#[test]
fn run_refuses_a_spec_that_cannot_fit_its_gpus() {
    let dir = scratch("run");
    let path = dir.join("small-gpus.yaml");
    let text = example("seed003-llama3-2.2b.yaml").replace("gpuMemory: 48Gi", "gpuMemory: 16Gi");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .arg("run")
        .arg(&path)
        .arg("--output")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(crds::contract::FailureReason::InvalidConfig.exit_code()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.topology.gpuMemory") && stderr.contains("has 16.0 GiB"), "{stderr}");
    assert!(!dir.join("out").exists(), "nothing was written");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The planner's step peak per rank against the peak the CPU allocator handed out on 2
/// ranks, within 15%: nano and micro at two micro-batches, with and without
/// checkpointing, under every strategy, and tiny at two (`trainer bench-memory` runs the
/// full table recorded in docs/perf.md).
#[test]
fn the_planned_step_peak_matches_the_allocator_within_15_percent() {
    tch::set_num_threads(1);
    let mut cases = Vec::new();
    for preset in ["nano", "micro"] {
        for micro_batch in [2, 4] {
            for checkpointing in [false, true] {
                for parallelism in [Parallelism::Ddp, Parallelism::Zero1, Parallelism::Zero2, Parallelism::Fsdp] {
                    cases.push((preset, micro_batch, checkpointing, parallelism));
                }
            }
        }
    }
    cases.push(("tiny", 2, false, Parallelism::Ddp));
    cases.push(("tiny", 2, true, Parallelism::Zero1));
    let mut report = Vec::new();
    for (preset, micro_batch, checkpointing, parallelism) in cases {
        let case = MemoryCase {
            preset: preset.into(),
            ranks: 2,
            micro_batch,
            seq: 256,
            checkpointing,
            parallelism,
            hardware: Hardware::Cpu,
        };
        let r = measure(&case).unwrap();
        report.push(format!("{case:?}: planned {} measured {} ratio {:.3}", r.planned, r.measured, r.ratio()));
        assert!(r.measured > r.resident, "{case:?}: the step allocates");
        assert!((0.85..=1.15).contains(&r.ratio()), "{}", report.join("\n"));
    }
}
