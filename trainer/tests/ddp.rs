//! Data parallelism through libtorch's c10d on CPU (Gloo): ranks as threads of one
//! process for the numerical checks, and as processes of `trainer run` / `trainer
//! launch` for resume, SIGTERM and a worker that dies.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crds::config::RunConfig;
use crds::contract::{FailureReason, TerminationMessage};
use crds::types::Parallelism;
use tch::Tensor;
use trainer::dist::{self, Placement};
use trainer::telemetry;
use trainer::telemetry::server::SharedStatus;
use trainer::train::{RunOptions, Trainer};

mod common;
use common::{
    config, manifest_yaml, max_rel_loss_diff, run, run_until_step, scratch, sigterm, step_losses, trainer_bin,
};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn options(dir: &Path, placement: Placement) -> RunOptions {
    RunOptions {
        output_dir: dir.to_path_buf(),
        stop_after_steps: None,
        tty: Some(false),
        sample: false,
        init_dir: dir.to_path_buf(),
        placement,
        sync_every: None,
    }
}

/// Runs `f` on every rank of a `cfg.topology.world_size` gang, one thread each.
fn on_ranks<T: Send>(cfg: &RunConfig, dir: &Path, f: impl Fn(Trainer) -> T + Sync) -> Vec<T> {
    let dirs = vec![dir.to_path_buf(); cfg.topology.world_size as usize];
    on_ranks_in(cfg, &dirs, None, f)
}

/// [`on_ranks`] with an output directory per rank and a step limit.
fn on_ranks_in<T: Send>(
    cfg: &RunConfig,
    dirs: &[PathBuf],
    stop_after: Option<u64>,
    f: impl Fn(Trainer) -> T + Sync,
) -> Vec<T> {
    let world = cfg.topology.world_size;
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let f = &f;
                let dir = &dirs[rank as usize];
                s.spawn(move || {
                    let placement = Placement {
                        rank,
                        local_rank: rank,
                        world_size: world,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    let mut opts = options(dir, placement);
                    opts.stop_after_steps = stop_after;
                    f(Trainer::new(cfg, opts).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn max_abs_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

#[test]
fn two_ranks_give_the_loss_and_gradients_of_one_rank_with_twice_the_micro_batch() {
    for recompute in [false, true] {
        two_ranks_match_one(recompute);
    }
}

fn two_ranks_match_one(gradient_checkpointing: bool) {
    let yaml = |nodes, micro| {
        manifest_yaml(nodes, micro, 1024, "4K")
            .replace("precision: f32", &format!("precision: f32\n  gradientCheckpointing: {gradient_checkpointing}"))
    };
    // Two micro-steps of accumulation: only the last one is synchronized.
    let one = config(&yaml(1, 8));
    let two = config(&yaml(2, 4));
    assert_eq!((one.batch.grad_accum, two.batch.grad_accum), (2, 2));
    assert_eq!(two.gradient_checkpointing, gradient_checkpointing);
    let dir = scratch("grads");
    let (loss1, grads1) = {
        let mut t = Trainer::new(&one, options(&dir, Placement::single())).unwrap();
        let loss = t.compute_gradients().unwrap().double_value(&[]);
        (loss, t.gradients().unwrap())
    };
    let ranks = on_ranks(&two, &dir, |mut t| {
        let loss = t.compute_gradients().unwrap().double_value(&[]);
        (loss, t.gradients().unwrap())
    });
    for (rank, (loss, grads)) in ranks.iter().enumerate() {
        assert!((loss - loss1).abs() < 1e-5, "rank {rank}: loss {loss} vs {loss1}");
        let diff = max_abs_diff(grads, &grads1);
        assert!(diff < 1e-5, "checkpointing {gradient_checkpointing}, rank {rank}: gradients differ by {diff}");
        let norm: f64 = grads.iter().map(|(_, g)| g.square().sum(tch::Kind::Double).double_value(&[])).sum();
        assert!(norm > 1e-6, "gradients must not be zero");
    }
    assert_eq!(max_abs_diff(&ranks[0].1, &ranks[1].1), 0.0, "every rank holds the same averaged gradients");
}

/// A tied GPT-2 (the embedding gets gradients from the lm_head and from the input
/// side) with the loss in several chunks: every backward pass must hand each
/// parameter to the overlapping reducer once, and two ranks must average to one rank
/// on the whole batch.
#[test]
fn the_reducer_overlaps_the_chunked_and_the_checkpointed_backwards_of_a_tied_model() {
    use crds::presets::{Arch, ModelConfig, preset};
    use tch::nn::VarStore;
    use tch::{Device, Kind};
    use trainer::dist::{Backend, GlooDevice, GradReducer, GroupOptions, ProcessGroup, Timeouts};
    use trainer::model::Model;

    let mut cfg = ModelConfig::from(preset("nano").unwrap());
    (cfg.arch, cfg.tied_embeddings, cfg.n_kv_head) = (Arch::Gpt2, true, cfg.n_head);
    // torch's RNG is global, and the other tests' trainers seed and draw from it in
    // their threads: every seeded draw here holds the trainer's lock on it.
    let seeded = |seed: i64| {
        let guard = trainer::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(seed);
        guard
    };
    let build = || {
        let _rng = seeded(11);
        let vs = VarStore::new(Device::Cpu);
        let model = Model::new(&vs.root(), &cfg, Device::Cpu).unwrap();
        (vs, model)
    };
    let idx = {
        let _rng = seeded(5);
        Tensor::randint(cfg.vocab_size as i64, [4, 17], (Kind::Int64, Device::Cpu))
    };
    let (x, y) = (idx.narrow(1, 0, 16), idx.narrow(1, 1, 16));
    let grads = |vs: &VarStore| {
        let mut g: Vec<_> = vs.variables().into_iter().map(|(n, v)| (n, v.grad().copy())).collect();
        g.sort_by(|a, b| a.0.cmp(&b.0));
        g
    };
    // 32 tokens per rank in chunks of 12: three chunks, the last one short. Of the two
    // blocks none, one or both are recomputed.
    for recomputed in [0, 1, 2] {
        let backward = |model: &Model, x: &Tensor, y: &Tensor| model.backward_checkpointed(x, y, 1.0, 12, recomputed);
        let (vs, model) = build();
        let whole_loss = backward(&model, &x, &y).unwrap().double_value(&[]);
        let whole = grads(&vs);
        let port = free_port();
        // Built here: torch's RNG is global, so threads would interleave their draws.
        let replicas: Vec<_> = (0..2).map(|_| build()).collect();
        let ranks: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u32)
                .zip(replicas)
                .map(|(rank, (vs, model))| {
                    let (backward, grads) = (&backward, &grads);
                    let (x, y) = (x.narrow(0, 2 * rank as i64, 2), y.narrow(0, 2 * rank as i64, 2));
                    s.spawn(move || {
                        let group = std::sync::Arc::new(
                            ProcessGroup::new(&GroupOptions {
                                backend: Backend::Gloo,
                                master_addr: "127.0.0.1".into(),
                                master_port: port,
                                rank,
                                world_size: 2,
                                timeouts: Timeouts::both(Duration::from_secs(60)),
                                gloo_device: GlooDevice::Host("127.0.0.1".into()),
                                cuda_device: 0,
                            })
                            .unwrap(),
                        );
                        // A 1 KiB cap: many buckets, launched from the hooks as they fill.
                        let params = vs.trainable_variables();
                        let reducer = GradReducer::new(group, &params, &vec![0; params.len()], 1024).unwrap();
                        assert!(reducer.n_buckets() > 4);
                        reducer.prepare().unwrap();
                        let loss = backward(&model, &x, &y).unwrap().double_value(&[]);
                        reducer.finish().unwrap();
                        (loss, grads(&vs))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mean_loss = ranks.iter().map(|(l, _)| l).sum::<f64>() / 2.0;
        assert!((mean_loss - whole_loss).abs() < 1e-5, "{recomputed} recomputed: {mean_loss} vs {whole_loss}");
        for (rank, (_, g)) in ranks.iter().enumerate() {
            let diff = max_abs_diff(&whole, g);
            assert!(diff < 1e-5, "{recomputed} recomputed, rank {rank}: gradients differ from one rank's by {diff}");
        }
    }
}

#[test]
fn three_ranks_train_like_one_rank_and_stay_identical() {
    let one = config(&manifest_yaml(1, 6, 384, "1536"));
    let three = config(&manifest_yaml(3, 2, 384, "1536"));
    assert_eq!((three.schedule.total_steps, three.batch.grad_accum), (4, 1));
    let dir = scratch("three");
    let single: Vec<f64> = {
        let mut t = Trainer::new(&one, options(&dir, Placement::single())).unwrap();
        (0..4).map(|_| t.train_step().unwrap().loss).collect()
    };
    let ranks = on_ranks(&three, &dir, |mut t| {
        let losses: Vec<f64> = (0..4).map(|_| t.train_step().unwrap().loss).collect();
        let params: Vec<Tensor> = t.parameters().unwrap().into_iter().map(|(_, p)| p).collect();
        (losses, dist::parameter_checksum(&params).unwrap())
    });
    for (rank, (losses, _)) in ranks.iter().enumerate() {
        for (step, (a, b)) in losses.iter().zip(&single).enumerate() {
            assert!((a - b).abs() < 1e-5, "rank {rank} step {}: loss {a} vs {b}", step + 1);
        }
    }
    assert!(ranks.iter().all(|(_, sum)| sum == &ranks[0].1), "parameters diverged across ranks");
}

#[test]
fn a_rank_whose_world_size_disagrees_with_the_run_is_refused() {
    let cfg = config(&manifest_yaml(2, 4, 1024, "4K"));
    let dir = scratch("mismatch");
    let err = Trainer::new(&cfg, options(&dir, Placement::single())).err().unwrap();
    assert!(err.to_string().contains("spec.topology asks for 2 processes"), "{err}");
}

#[test]
fn a_rank_alone_fails_rendezvous_with_collective_timeout() {
    // A run's rendezvous waits at least 5 minutes (`rendezvous_timeout_seconds`), so the
    // placement joins with a short bound of its own.
    let placement =
        Placement { rank: 1, local_rank: 0, world_size: 2, master_addr: "127.0.0.1".into(), master_port: free_port() };
    let started = Instant::now();
    let timeouts = dist::Timeouts::both(Duration::from_secs(2));
    let err = placement.join(tch::Device::Cpu, timeouts).err().unwrap();
    assert_eq!(err.reason(), Some(FailureReason::CollectiveTimeout), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}

#[test]
fn two_processes_resume_after_a_stop_with_the_same_loss_sequence() {
    let dir = scratch("resume");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, manifest_text_for_processes()).unwrap();
    let full = run(&manifest, &dir.join("full"), &[]);
    assert!(full.status.success(), "{}", String::from_utf8_lossy(&full.stderr));
    let full = step_losses(&dir.join("full/metrics.jsonl"));
    assert_eq!(full.len(), 8);

    // Resumed, and reading losses back every 3 steps: the same run.
    let out = dir.join("resumed");
    let first = run(&manifest, &out, &["--stop-after-steps", "4", "--sync-every", "3"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let second = run(&manifest, &out, &["--sync-every", "3"]);
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    assert_eq!(
        step_losses(&out.join("metrics.jsonl")),
        full,
        "the resumed 2-rank run must repeat the uninterrupted one"
    );
}

/// A rank slowed by 200 ms a step (`TRAINER_INJECT_SLOW_STEP_MS` on rank 1) shows as
/// slow in every rank's step times, which rank 0 gathers at each sync and reports: the
/// others' compute stays what it was, though their steps wait for it in the all-reduce.
#[test]
fn a_slow_rank_stands_out_in_the_gathered_step_times() {
    let slow = [("TRAINER_INJECT_SLOW_STEP_MS", "200"), ("TRAINER_INJECT_RANK", "1")];
    let (out, log) = common::run_logged(&scratch("slow-rank"), &manifest_text_for_processes(), &slow);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let Some(crds::contract::ExitReport::Success(report)) = crds::contract::ExitReport::parse(&log.unwrap_or_default())
    else {
        panic!("no final report")
    };
    let ranks = &report.ranks;
    assert_eq!(ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1], "{ranks:?}");
    // The sleep is inside rank 1's compute; how long rank 0's own compute takes depends on
    // the machine's load (it shares 2 cores with other tests), so only the order is asserted.
    let (fast, slow) = (ranks[0].compute_seconds, ranks[1].compute_seconds);
    assert!(slow >= 0.2 && slow > fast, "rank 1 sleeps 200 ms a step: {ranks:?}");
    assert!(ranks.iter().all(|r| r.data_wait_seconds >= 0.0 && r.data_wait_seconds < 0.2), "{ranks:?}");
}

/// Two CPU ranks, 8 steps, checkpoints every 4.
fn manifest_text_for_processes() -> String {
    manifest_yaml(2, 4, 1024, "8192")
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank_after_the_same_step_with_a_checkpoint() {
    let dir = scratch("sigterm");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, manifest_yaml(2, 4, 1024, "400K")).unwrap();
    // Reading back every step, and every 3 steps (the ranks agree only at reads).
    for (name, sync_every) in [("every", "1"), ("deferred", "3")] {
        let out = dir.join(name);
        let mut child = run_until_step(&manifest, &out, &["--sync-every", sync_every], 2, name);
        sigterm(&child);
        let log = out.join("metrics.jsonl");
        assert_eq!(child.wait().unwrap().code(), Some(143), "{name}");
        let steps = step_losses(&log);
        let last_step = steps.last().unwrap().0;
        assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=last_step).collect::<Vec<_>>(), "{name}");
        let latest = std::fs::read_to_string(out.join("latest")).unwrap();
        assert_eq!(
            latest.trim(),
            format!("step-{last_step:08}"),
            "{name}: rank 0 checkpoints the step every rank stopped after"
        );
    }
}

#[test]
fn a_killed_worker_fails_its_launcher_with_its_code_and_the_peers_with_collective_timeout() {
    let dir = scratch("kill");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, manifest_yaml(2, 4, 1024, "400K")).unwrap();
    let resolved = trainer_bin().arg("resolve").arg(&manifest).output().unwrap();
    assert!(resolved.status.success());
    let config = dir.join("run.json");
    std::fs::write(&config, &resolved.stdout).unwrap();
    let port = free_port();
    let node = |rank: u32| {
        let log = dir.join(format!("termination-{rank}"));
        let child = trainer_bin()
            .arg("launch")
            .env("TRAINER_CONFIG", &config)
            .args(["--output"])
            .arg(dir.join("pvc"))
            .args(["--init-dir"])
            .arg(&dir)
            .env("NNODES", "2")
            .env("NPROC_PER_NODE", "1")
            .env("JOB_COMPLETION_INDEX", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TRAINER_STATUS_PORT", free_port().to_string())
            .env("TRAINER_TERMINATION_LOG", &log)
            .env("TRAINER_INJECT_KILL_AT_STEP", "3")
            .env("TRAINER_INJECT_RANK", "1")
            .stderr(std::fs::File::create(dir.join(format!("stderr-{rank}"))).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    };
    let (mut node0, log0) = node(0);
    let (mut node1, _) = node(1);
    let status1 = node1.wait().unwrap();
    let died = Instant::now();
    let stderr1 = std::fs::read_to_string(dir.join("stderr-1")).unwrap_or_default();
    assert_eq!(status1.code(), Some(137), "node 1's launcher exits as its SIGKILLed worker: {stderr1}");
    let status0 = node0.wait().unwrap();
    let waited = died.elapsed();
    assert_eq!(status0.code(), Some(FailureReason::CollectiveTimeout.exit_code()));
    assert!(waited < Duration::from_secs(20 + 10), "rank 0 must give up within the collective timeout: {waited:?}");
    let msg = TerminationMessage::parse(&std::fs::read_to_string(&log0).unwrap()).unwrap();
    assert_eq!(msg.reason, FailureReason::CollectiveTimeout);
    assert_eq!(msg.step, Some(3), "{}", msg.detail);
}

#[test]
fn the_run_config_is_the_contract_between_launcher_and_worker() {
    // The launcher refuses a gang shape that does not match the run.
    let dir = scratch("shape");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, manifest_yaml(2, 4, 1024, "4K")).unwrap();
    let resolved = trainer_bin().arg("resolve").arg(&manifest).output().unwrap();
    let config = dir.join("run.json");
    std::fs::write(&config, &resolved.stdout).unwrap();
    let out = trainer_bin().arg("launch").arg("--config").arg(&config).args(["--nnodes", "3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(FailureReason::InvalidConfig.exit_code()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NNODES=3") && stderr.contains("2 processes"), "{stderr}");
}

#[test]
fn ranks_that_load_different_checkpoints_refuse_to_train() {
    let cfg = config(&manifest_yaml(2, 4, 1024, "8192"));
    let dir = scratch("diverged");
    let stop = || std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two runs of the same gang, stopped at steps 2 and 4 with a checkpoint each.
    for steps in [2, 4] {
        let run_dir = dir.join(format!("steps{steps}"));
        on_ranks_in(&cfg, &[run_dir.clone(), run_dir], Some(steps), |t| {
            telemetry::run(t, &SharedStatus::from_config(&cfg), stop()).unwrap()
        });
    }
    // Rank 0 now resumes from step 2 and rank 1 from step 4: the parameters differ.
    let dirs = [dir.join("steps2"), dir.join("steps4")];
    let port = free_port();
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(rank, d)| {
                let cfg = &cfg;
                s.spawn(move || {
                    let placement = Placement {
                        rank: rank as u32,
                        local_rank: rank as u32,
                        world_size: 2,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    Trainer::new(cfg, options(d, placement)).err().map(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().expect("both ranks must refuse")).collect()
    });
    for e in &errors {
        assert!(e.contains("the ranks loaded different parameters"), "{e}");
    }
}

#[test]
fn a_killed_worker_on_the_same_node_stops_its_peer_and_the_launcher_exits_with_its_code() {
    let dir = scratch("kill-local");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, manifest_yaml(2, 4, 1024, "400K")).unwrap();
    let started = Instant::now();
    let out = trainer_bin()
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join("out"))
        .arg(&manifest)
        .env("TRAINER_INJECT_KILL_AT_STEP", "2")
        .env("TRAINER_INJECT_RANK", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("worker rank 1 exited with code 137"));
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
}

#[test]
fn the_tiny_local_example_trains_on_two_ranks() {
    let dir = scratch("tiny-local");
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/tiny-local.yaml");
    let out = trainer_bin()
        .env("RUST_LOG", "info")
        .args(["run", "--no-sample", "--stop-after-steps", "2", "-o"])
        .arg(dir.join("out"))
        .arg(manifest)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("joined a Gloo group of 2 ranks"), "{stderr}");
    assert_eq!(step_losses(&dir.join("out/metrics.jsonl")).len(), 2);
    assert_eq!(std::fs::read_to_string(dir.join("out/latest")).unwrap().trim(), "step-00000002");
}

#[test]
fn the_bench_runs_its_steps_through_a_world_size_one_group_and_the_reducer() {
    let out = trainer_bin()
        .args(["bench", "--preset", "nano", "--device", "cpu", "--precision", "f32", "--ddp"])
        .args(["--micro-batch", "2", "--seq", "64", "--steps", "2", "--warmup", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ddp"]["backend"], "gloo", "{json}");
    assert_eq!(json["ddp"]["world_size"], 1, "{json}");
    assert!(json["final_loss"].as_f64().unwrap().is_finite(), "{json}");
}

/// `parallelism: zero1`, `zero2` and `fsdp` train the same model as ddp, on 2 and on 3 ranks,
/// with gradient accumulation, the chunked loss and gradient checkpointing, untied
/// (nano) on 2 ranks and with GPT-2's tied embeddings on 3: the same losses over 20
/// steps and the same final weights, within 1e-6.
#[test]
fn sharded_strategies_train_like_ddp_on_two_and_three_ranks() {
    for (world, micro, global) in [(2u32, 4u32, 1024u32), (3, 2, 768)] {
        let yaml = |parallelism: &str| {
            manifest_yaml(world, micro, global, &(20 * global).to_string()).replace(
                "precision: f32",
                &format!("precision: f32\n  gradientCheckpointing: true\n  parallelism: {parallelism}"),
            )
        };
        let tie = |mut cfg: RunConfig| {
            if world == 3 {
                let m = &mut cfg.model;
                (m.arch, m.tied_embeddings, m.n_kv_head) = (crds::presets::Arch::Gpt2, true, m.n_head);
            }
            cfg
        };
        let dir = scratch(&format!("sharded-{world}"));
        let train = |cfg: &RunConfig| {
            on_ranks(cfg, &dir, |mut t| {
                let losses: Vec<f64> = (0..20).map(|_| t.train_step().unwrap().loss).collect();
                let params: Vec<(String, Tensor)> =
                    t.parameters().unwrap().into_iter().map(|(n, p)| (n, p.detach_copy())).collect();
                let sums: Vec<f64> =
                    params.iter().map(|(_, p)| p.abs().sum(tch::Kind::Double).double_value(&[])).collect();
                (losses, params.iter().map(|(n, _)| n.clone()).zip(sums).collect::<Vec<_>>(), params_checksum(&params))
            })
        };
        let ddp = train(&tie(config(&yaml("ddp"))));
        assert!(ddp[0].0[19] < ddp[0].0[0], "it learns: {:?}", ddp[0].0);
        for strategy in ["zero1", "zero2", "fsdp", "fsdp without recomputation"] {
            let (name, recompute) = match strategy.split_once(' ') {
                Some((name, _)) => (name, false),
                None => (strategy, true),
            };
            let text = yaml(name);
            let text = if recompute {
                text
            } else {
                text.replace("gradientCheckpointing: true", "gradientCheckpointing: false")
            };
            let cfg = tie(config(&text));
            assert_eq!((cfg.batch.grad_accum, cfg.schedule.total_steps), (2, 20));
            let got = train(&cfg);
            for rank in 0..world as usize {
                let diff = max_rel_loss_diff(&ddp[rank].0, &got[rank].0);
                assert!(
                    diff < 1e-6,
                    "{strategy}, world {world} rank {rank}: losses differ by {diff:e}\n{:?}\n{:?}",
                    ddp[rank].0,
                    got[rank].0
                );
                for ((name, x), (_, y)) in ddp[rank].1.iter().zip(&got[rank].1) {
                    assert!(
                        (x - y).abs() <= 1e-6 * x.abs().max(y.abs()),
                        "{strategy}, world {world} rank {rank} {name}: Σ|w| {x} vs {y}"
                    );
                }
            }
            assert!(got.iter().all(|r| r.2 == got[0].2), "{strategy}'s ranks hold the same parameters (world {world})");
        }
    }
}

fn params_checksum(params: &[(String, Tensor)]) -> [f64; 3] {
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    dist::parameter_checksum(&tensors).unwrap()
}

/// A checkpoint does not depend on the strategy: a 2-rank run trained under ddp, then
/// resumed under zero1, zero2, fsdp (with and without recomputation, evaluating) and ddp
/// again, follows the uninterrupted ddp curve.
#[test]
fn a_run_resumes_across_strategies_on_the_uninterrupted_curve() {
    let dir = scratch("strategies");
    let manifest = dir.join("run.yaml");
    let write = |parallelism: &str| {
        let (strategy, extra) = match parallelism.split_once('+') {
            Some((s, "recompute")) => (s, "\n  gradientCheckpointing: true"),
            _ => (parallelism, ""),
        };
        let text = manifest_text_for_processes()
            .replace("precision: f32", &format!("precision: f32\n  parallelism: {strategy}{extra}"));
        std::fs::write(&manifest, text).unwrap();
    };
    write("ddp");
    let full = run(&manifest, &dir.join("full"), &[]);
    assert!(full.status.success(), "{}", String::from_utf8_lossy(&full.stderr));
    let full = step_losses(&dir.join("full/metrics.jsonl"));
    assert_eq!(full.len(), 8);

    let out = dir.join("moved");
    for (parallelism, stop) in [
        ("ddp", Some("1")),
        ("zero1", Some("2")),
        ("zero2", Some("3")),
        ("fsdp", Some("5")),
        ("fsdp+recompute", Some("7")),
        ("ddp", None),
    ] {
        write(parallelism);
        let extra: Vec<&str> = stop.map(|s| vec!["--stop-after-steps", s]).unwrap_or_default();
        let o = run(&manifest, &out, &extra);
        assert!(o.status.success(), "{parallelism}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let moved = step_losses(&out.join("metrics.jsonl"));
    assert_eq!(moved.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=8).collect::<Vec<_>>());
    let (a, b): (Vec<f64>, Vec<f64>) = (full.iter().map(|s| s.1).collect(), moved.iter().map(|s| s.1).collect());
    let diff = max_rel_loss_diff(&a, &b);
    assert!(diff < 1e-6, "losses differ by {diff:e}:\n{a:?}\n{b:?}");
}

/// `trainer bench-ddp` measures zero1, zero2 and fsdp against ddp: each of 2 ranks holds
/// about half the optimizer state (its shard, plus alignment padding), and between steps
/// fsdp holds less than zero2, which holds less than zero1, which holds less than ddp.
#[test]
fn bench_ddp_reports_what_each_strategy_holds_per_rank() {
    let report = trainer::bench::ddp::run(&trainer::bench::ddp::DdpBenchOptions {
        ranks: 2,
        preset: "nano".into(),
        micro_batch: 2,
        seq: 32,
        steps: 1,
        warmup: 0,
        sizes_mib: vec![0.25],
        strategies: vec![Parallelism::Zero1, Parallelism::Zero2, Parallelism::Fsdp],
    })
    .unwrap();
    let s = &report["strategies"];
    let f = |strategy: &str, field: &str| s[strategy][field].as_f64().unwrap_or_else(|| panic!("{field}: {report}"));
    assert!(f("ddp", "optimizer_state_bytes_per_rank") > 7_000_000.0, "nano's two f32 moments: {report}");
    for strategy in ["zero1", "zero2", "fsdp"] {
        assert!((0.49..0.51).contains(&f(strategy, "optimizer_state_over_ddp")), "{strategy}: {report}");
        assert!(f(strategy, "step_time_over_ddp") > 0.0);
    }
    assert!(f("fsdp", "resident_bytes_per_rank") < f("zero2", "resident_bytes_per_rank"), "{report}");
    assert!(f("zero2", "resident_bytes_per_rank") < f("zero1", "resident_bytes_per_rank"), "{report}");
    assert!(f("zero1", "resident_bytes_per_rank") < f("ddp", "resident_bytes_per_rank"), "{report}");
}
