//! The resolver: derived numbers, and every validation rule with a bad input whose
//! error names the field.

use crds::config::{Device, Location};
use crds::types::*;
use crds::{InvalidSpec, RunConfig, TrainingRun};

fn run() -> TrainingRun {
    crds::manifest::from_yaml(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: r, namespace: ml}
spec:
  model: {preset: micro}
  tokens: 1M
  data:
    mix:
      - {name: a, weight: 0.75, uri: embedded:textbook}
      - {name: b, weight: 0.25, uri: s3://bucket/shards/b}
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {globalTokens: 8192, microBatch: 8, seqLength: 256}
"#,
        "test",
    )
    .unwrap()
}

fn grpo_run() -> TrainingRun {
    let mut r = run();
    r.spec.phase = Phase::Grpo;
    r.spec.data = None;
    r.spec.batch.global_tokens = None;
    r.spec.grpo = Some(GrpoSpec { max_new_tokens: 64, ..GrpoSpec::new("embedded:mcq") });
    r.spec.init_from = Some(InitFrom { training_run: Some("base".into()), uri: None });
    r
}

fn ok(r: &TrainingRun) -> RunConfig {
    crds::resolve(r).unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn fails(r: &TrainingRun, field: &str, needle: &str) -> InvalidSpec {
    let err = crds::resolve(r).expect_err("must be rejected");
    let hit = err.0.iter().find(|e| e.field == field).unwrap_or_else(|| panic!("no error names {field}: {err}"));
    assert!(hit.message.contains(needle), "{field}: expected {needle:?} in {:?}", hit.message);
    assert!(err.to_string().contains(&format!("{field}: ")), "{err}");
    err
}

#[test]
fn derives_world_size_accumulation_and_steps() {
    let c = ok(&run());
    assert_eq!((c.topology.world_size, c.topology.procs_per_node, c.topology.device), (1, 1, Device::Cpu));
    assert_eq!((c.batch.micro_batch, c.batch.seq_len, c.batch.grad_accum), (8, 256, 4));
    assert_eq!(c.batch.tokens_per_step, 8192);
    assert_eq!(c.batch.global_sequences, 32);
    assert_eq!(c.schedule.total_steps, 1_000_000 / 8192);
    assert_eq!(c.schedule.total_tokens, 122 * 8192);
    assert_eq!(c.schedule.budget_tokens, 1_000_000);
    assert_eq!(c.namespace.as_deref(), Some("ml"));

    let mut r = run();
    r.spec.topology.nodes = 2;
    r.spec.topology.gpus_per_node = 2;
    r.spec.batch.global_tokens = Some(65_536.into());
    r.spec.batch.micro_batch = 2;
    let c = ok(&r);
    assert_eq!((c.topology.world_size, c.topology.device, c.topology.display.as_str()), (4, Device::Cuda, "2x2"));
    assert_eq!(c.batch.grad_accum, 32);
    assert_eq!(c.schedule.total_steps, 15);
}

#[test]
fn defaults_follow_the_seeds() {
    let c = ok(&run());
    assert_eq!((c.schedule.lr, c.schedule.min_lr), (3e-4, 3e-5));
    assert_eq!(c.schedule.warmup_tokens, 50_000, "min(100M, tokens / 20)");
    assert_eq!(
        (c.optimizer.weight_decay, c.optimizer.beta1, c.optimizer.beta2, c.optimizer.grad_clip),
        (0.1, 0.9, 0.95, 1.0)
    );
    assert_eq!(c.checkpoint.dir, "/checkpoints");
    assert_eq!((c.checkpoint.every_steps, c.checkpoint.keep_last), (1000, 3));
    assert_eq!(c.failure.stall_timeout_seconds, 1800);
    assert_eq!(c.failure.max_restarts, 3);
    assert_eq!(c.tokenizer, Location::Embedded { name: "bpe".into() });
    assert_eq!(
        c.data.as_ref().unwrap().mix[1].location,
        Location::S3 { bucket: "bucket".into(), prefix: "shards/b".into() }
    );
    let g = ok(&grpo_run());
    assert_eq!((g.schedule.lr, g.schedule.min_lr), (1e-5, 1e-5));
    let grpo = g.grpo.unwrap();
    assert_eq!((grpo.prompts_per_step, grpo.generations_per_prompt, grpo.length_penalty), (8, 16, 0.01));
    assert_eq!(grpo.clip_epsilon_high, grpo.clip_epsilon_low);
}

#[test]
fn lr_schedule_warms_up_then_decays_to_min() {
    let s = ok(&run()).schedule;
    assert!((s.lr_at(0) - s.lr / s.warmup_tokens as f64).abs() < 1e-15);
    assert!(s.lr_at(s.warmup_tokens / 2) < s.lr);
    assert_eq!(s.lr_at(s.warmup_tokens), s.lr);
    let mid = s.warmup_tokens + (s.total_tokens - s.warmup_tokens) / 2;
    assert!((s.lr_at(mid) - (s.lr + s.min_lr) / 2.0).abs() < 1e-9);
    assert!((s.lr_at(s.total_tokens) - s.min_lr).abs() < 1e-15);
    assert!((s.lr_at(s.total_tokens * 2) - s.min_lr).abs() < 1e-15);
    let mut prev = f64::MAX;
    for t in (s.warmup_tokens..=s.total_tokens).step_by(8192) {
        assert!(s.lr_at(t) <= prev);
        prev = s.lr_at(t);
    }
    let mut r = run();
    r.spec.optimizer.schedule = Schedule::Constant;
    let c = ok(&r).schedule;
    assert_eq!(c.lr_at(c.total_tokens), c.lr);
}

#[test]
fn checkpointed_blocks_count_leading_blocks_of_a_checkpointed_run() {
    let mut r = run();
    assert_eq!(ok(&r).recomputed_blocks(), 0);
    r.spec.gradient_checkpointing = true;
    assert_eq!(ok(&r).recomputed_blocks(), 6, "micro has 6 blocks, all recomputed by default");
    r.spec.checkpointed_blocks = Some(2);
    assert_eq!(ok(&r).recomputed_blocks(), 2);
    r.spec.checkpointed_blocks = Some(7);
    fails(&r, "spec.checkpointedBlocks", "more than the model's 6 blocks");
    r.spec.checkpointed_blocks = Some(0);
    fails(&r, "spec.checkpointedBlocks", "at least 1");
    r.spec.checkpointed_blocks = Some(2);
    r.spec.gradient_checkpointing = false;
    fails(&r, "spec.checkpointedBlocks", "needs spec.gradientCheckpointing: true");
}

#[test]
fn fingerprint_ignores_attempt_and_memory_knobs_but_not_training_facts() {
    let a = ok(&run());
    let mut b = a.clone();
    b.attempt = 7;
    b.topology.collective_timeout_seconds = 60;
    b.topology.bucket_cap_mb = 100;
    // The out-of-memory remedies: the same global batch in smaller pieces, recomputed.
    (b.batch.micro_batch, b.batch.grad_accum) = (a.batch.micro_batch / 2, a.batch.grad_accum * 2);
    b.gradient_checkpointing = !a.gradient_checkpointing;
    b.checkpointed_blocks = Some(1);
    b.attention = Attention::Math;
    // Checkpoints hold consolidated state, so the sharding strategy may change too, and
    // the GPU the run was planned for.
    b.parallelism = Parallelism::Fsdp;
    b.topology.gpu_memory_bytes = Some(48 << 30);
    // And the number of ranks that split each step's global batch.
    (b.topology.nodes, b.topology.world_size, b.topology.display) = (3, 3, "3x0".into());
    // And the cadences of checkpoints and evaluation.
    (b.checkpoint.every_steps, b.checkpoint.keep_last) = (a.checkpoint.every_steps + 7, 9);
    if let Some(d) = &mut b.data {
        (d.eval_every_steps, d.eval_tokens) = (d.eval_every_steps + 3, d.eval_tokens * 2);
    }
    assert_eq!(a.fingerprint(), b.fingerprint());
    let changed = |f: &dyn Fn(&mut RunConfig)| {
        let mut c = a.clone();
        f(&mut c);
        c.fingerprint()
    };
    assert_ne!(a.fingerprint(), changed(&|c| c.batch.global_sequences *= 2));
    assert_ne!(a.fingerprint(), changed(&|c| c.batch.seq_len /= 2));
    assert_ne!(a.fingerprint(), changed(&|c| c.optimizer.beta2 = 0.99));
    assert_ne!(a.fingerprint(), changed(&|c| c.seed += 1));
}

#[test]
fn fsdp_is_for_pretraining() {
    let mut g = grpo_run();
    g.spec.parallelism = Parallelism::Fsdp;
    fails(&g, "spec.parallelism", "fsdp is for pretraining");
    g.spec.parallelism = Parallelism::Zero2;
    ok(&g);
    let mut p = run();
    p.spec.parallelism = Parallelism::Fsdp;
    assert_eq!(ok(&p).parallelism, Parallelism::Fsdp);
}

#[test]
fn parallelism_defaults_to_ddp_and_a_ddp_config_reads_as_before_the_field() {
    assert_eq!(ok(&run()).parallelism, Parallelism::Ddp);
    let json = serde_json::to_value(ok(&run())).unwrap();
    assert!(json.get("parallelism").is_none(), "ddp is not written: {json}");
    let mut r = run();
    r.spec.parallelism = Parallelism::Zero1;
    let zero1 = ok(&r);
    assert_eq!(zero1.parallelism, Parallelism::Zero1);
    assert_eq!(serde_json::to_value(&zero1).unwrap()["parallelism"], "zero1");
    let bad = crds::manifest::from_yaml(
        "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: r}\nspec:\n  parallelism: zero9\n",
        "bad.yaml",
    )
    .expect_err("an unknown strategy is refused");
    assert!(bad.to_string().contains("parallelism") && bad.to_string().contains("zero1"), "{bad}");
}

#[test]
fn name_must_be_a_short_dns_label() {
    for bad in ["", "Upper", "9start", "under_score", "end-", &"x".repeat(49)] {
        let mut r = run();
        r.metadata.name = Some(bad.to_string());
        crds::resolve(&r).expect_err(bad).names("metadata.name").then_some(()).expect(bad);
    }
}

#[test]
fn unknown_preset_lists_the_known_ones() {
    let mut r = run();
    r.spec.model.preset = "huge".into();
    fails(&r, "spec.model.preset", "known presets: nano, micro, tiny");
}

#[test]
fn model_overrides_are_checked() {
    let mut r = run();
    r.spec.model.heads = Some(5);
    fails(&r, "spec.model.heads", "5 heads do not divide dModel 384");
    let mut r = run();
    r.spec.model.heads = Some(12);
    r.spec.model.kv_heads = Some(5);
    fails(&r, "spec.model.kvHeads", "do not divide 12 heads");
    let mut r = run();
    r.spec.model.d_head = Some(63);
    fails(&r, "spec.model.dHead", "even head width");
    let mut r = run();
    r.spec.model.layers = Some(0);
    fails(&r, "spec.model.layers", "at least 1");
    let mut r = run();
    r.spec.model.d_model = Some(u32::MAX);
    fails(&r, "spec.model.dModel", "4294967295 is more than the 131072 a model may have");
    // Every dimension at its largest: counted without overflow, and refused only for
    // what it is (it fits no GPU).
    let mut r = run();
    let m = &mut r.spec.model;
    (m.layers, m.d_model, m.heads, m.kv_heads, m.d_head) =
        (Some(4096), Some(1 << 17), Some(4096), Some(4096), Some(1 << 14));
    (m.d_ff, m.vocab_size, m.seq_length) = (Some(1 << 20), Some(1 << 23), Some(1 << 23));
    let _ = crds::resolve(&r);
    let mut r = run();
    r.spec.model.rope_theta = Some(-1.0);
    fails(&r, "spec.model.ropeTheta", "positive");
    let mut r = run();
    r.spec.model.vocab_size = Some(1000);
    fails(&r, "spec.model.vocabSize", "smaller than the embedded tokenizer");
    // Valid overrides re-derive d_head and keep the GQA ratio.
    let mut r = run();
    r.spec.model.d_model = Some(512);
    r.spec.model.heads = Some(8);
    r.spec.model.layers = Some(3);
    let c = ok(&r);
    assert_eq!(
        (c.model.d_model, c.model.n_head, c.model.n_kv_head, c.model.d_head, c.model.n_layer),
        (512, 8, 2, 64, 3)
    );
}

#[test]
fn gpt2_has_no_gqa_and_no_rope() {
    let mut r = run();
    r.spec.model.preset = "gpt2-1b".into();
    r.spec.model.kv_heads = Some(8);
    r.spec.model.rope_theta = Some(1e4);
    let err = fails(&r, "spec.model.kvHeads", "no grouped-query attention");
    assert!(err.names("spec.model.ropeTheta"), "{err}");
}

#[test]
fn tokens_must_parse_and_cover_a_step() {
    let mut r = run();
    r.spec.tokens = "1M tokens".into();
    fails(&r, "spec.tokens", "is not a token count");
    let mut r = run();
    r.spec.tokens = 4096.into();
    fails(&r, "spec.tokens", "smaller than one step of 8192 tokens");
}

#[test]
fn global_tokens_must_be_a_multiple_of_a_micro_step() {
    let mut r = run();
    r.spec.batch.global_tokens = Some(10_000.into());
    fails(&r, "spec.batch.globalTokens", "microBatch 8 × seqLength 256 × world size 1 = 2048; use e.g. 8192 or 10240");
    let mut r = run();
    r.spec.batch.global_tokens = Some(1_000.into());
    fails(&r, "spec.batch.globalTokens", "use e.g. 2048");
    let mut r = run();
    r.spec.batch.global_tokens = None;
    fails(&r, "spec.batch.globalTokens", "required for phase pretrain");
    let mut r = run();
    r.spec.batch.micro_batch = 0;
    fails(&r, "spec.batch.microBatch", "at least 1");
}

#[test]
fn seq_length_fits_the_context() {
    let mut r = run();
    r.spec.batch.seq_length = Some(512);
    fails(&r, "spec.batch.seqLength", "exceeds the model's context of 256 tokens; raise spec.model.seqLength");
    r.spec.model.seq_length = Some(512);
    r.spec.batch.global_tokens = Some(16_384.into());
    assert_eq!(ok(&r).model.max_seq_len, 512);
}

#[test]
fn data_mix_rules() {
    let mut r = run();
    r.spec.data.as_mut().unwrap().mix[0].weight = 0.7;
    fails(&r, "spec.data.mix", "weights sum to 0.95");
    let mut r = run();
    r.spec.data.as_mut().unwrap().mix[0].weight = 0.0;
    r.spec.data.as_mut().unwrap().mix[1].weight = 1.0;
    fails(&r, "spec.data.mix[0].weight", "must be in (0, 1]");
    let mut r = run();
    r.spec.data.as_mut().unwrap().mix[1].name = "a".into();
    fails(&r, "spec.data.mix[1].name", "appears twice");
    let mut r = run();
    r.spec.data.as_mut().unwrap().mix.clear();
    fails(&r, "spec.data.mix", "at least one source");
    let mut r = run();
    r.spec.data = None;
    fails(&r, "spec.data", "required for phase pretrain");
    let mut r = run();
    r.spec.data.as_mut().unwrap().validation.tokens = "lots".into();
    fails(&r, "spec.data.validation.tokens", "not a token count");
}

#[test]
fn uris_are_parsed_with_clear_errors() {
    for (uri, needle) in [
        ("gs://bucket/x", "unsupported scheme \"gs\""),
        ("s3:///x", "has no bucket"),
        ("pvc:///x", "has no claim"),
        ("s3://data/web/../../../etc", "a '.' or '..' segment"),
        ("s3://data/./web", "a '.' or '..' segment"),
        ("pvc://datasets/../other-claim/x", "a '.' or '..' segment"),
        ("embedded:wiki", "no embedded corpus named \"wiki\""),
        ("", "must not be empty"),
    ] {
        let mut r = run();
        r.spec.data.as_mut().unwrap().mix[1].uri = Some(uri.into());
        fails(&r, "spec.data.mix[1].uri", needle);
    }
    let mut r = run();
    r.spec.data.as_mut().unwrap().mix[1].uri = Some("pvc://datasets/web/shards/".into());
    let c = ok(&r);
    assert_eq!(
        c.data.as_ref().unwrap().mix[1].location,
        Location::Pvc { claim: "datasets".into(), path: "web/shards".into() }
    );
    assert_eq!(c.pvc_claims(), vec!["datasets".to_string()]);
    let mut r = run();
    r.spec.model.tokenizer = "ftp://x/tokenizer.json".into();
    fails(&r, "spec.model.tokenizer", "unsupported scheme");
}

#[test]
fn a_mix_entry_names_a_dataset_or_a_uri_and_only_the_operator_resolves_a_dataset() {
    let mut r = run();
    let m = &mut r.spec.data.as_mut().unwrap().mix[1];
    (m.uri, m.dataset) = (None, Some("fineweb-edu".into()));
    fails(&r, "spec.data.mix[1].dataset", "resolved by the operator once it is Ready");
    let m = &mut r.spec.data.as_mut().unwrap().mix[1];
    m.uri = Some("s3://data/web".into());
    fails(&r, "spec.data.mix[1]", "exactly one of uri and dataset");
    let m = &mut r.spec.data.as_mut().unwrap().mix[1];
    (m.uri, m.dataset) = (None, None);
    fails(&r, "spec.data.mix[1]", "exactly one of uri and dataset");
}

/// An edit to part of a spec, the field it breaks, and a phrase of the error.
type Edit<T> = (fn(&mut T), &'static str, &'static str);

#[test]
fn optimizer_rules() {
    let cases: Vec<Edit<OptimizerSpec>> = vec![
        (|o| o.lr = Some(-1.0), "spec.optimizer.lr", "positive"),
        (|o| o.min_lr = Some(1.0), "spec.optimizer.minLr", "between 0 and lr"),
        (|o| o.betas = vec![0.9], "spec.optimizer.betas", "two numbers in [0, 1)"),
        (|o| o.betas = vec![0.9, 1.0], "spec.optimizer.betas", "two numbers in [0, 1)"),
        (|o| o.eps = 0.0, "spec.optimizer.eps", "positive"),
        (|o| o.weight_decay = -0.1, "spec.optimizer.weightDecay", "≥ 0"),
        (|o| o.grad_clip = f64::NAN, "spec.optimizer.gradClip", "≥ 0"),
        (|o| o.warmup_tokens = Some("2M".into()), "spec.optimizer.warmupTokens", "exceeds the 999.42K tokens"),
        (|o| o.warmup_tokens = Some("x".into()), "spec.optimizer.warmupTokens", "not a token count"),
    ];
    for (edit, field, needle) in cases {
        let mut r = run();
        edit(&mut r.spec.optimizer);
        fails(&r, field, needle);
    }
}

#[test]
fn checkpoint_rules() {
    let mut r = run();
    r.spec.checkpoint.every_steps = 0;
    fails(&r, "spec.checkpoint.everySteps", "at least 1");
    let mut r = run();
    r.spec.checkpoint.keep_last = 0;
    fails(&r, "spec.checkpoint.keepLast", "at least 1");
    let mut r = run();
    r.spec.topology.nodes = 2;
    r.spec.checkpoint.access_mode = Some(AccessMode::ReadWriteOnce);
    fails(&r, "spec.checkpoint.accessMode", "cannot be mounted by pods on 2 nodes");
    let mut r = run();
    r.spec.checkpoint.s3 =
        Some(S3Mirror { uri: "gs://b".into(), secret_ref: SecretRef { name: "c".into() }, ..Default::default() });
    fails(&r, "spec.checkpoint.s3.uri", "must start with s3://");
    let mut r = run();
    r.spec.checkpoint.s3 = Some(S3Mirror { uri: "s3://b/ckpt".into(), ..Default::default() });
    fails(&r, "spec.checkpoint.s3.secretRef.name", "must name a Secret");
}

#[test]
fn keep_best_needs_validation_at_every_checkpoint() {
    // (checkpoint every, validation every, phase grpo, the error's words or None)
    let cases: [(u32, u32, bool, Option<&str>); 6] = [
        (1000, 1000, false, None),
        (1000, 250, false, None),
        (1000, 300, false, Some("validation runs every 300 steps and checkpoints every 1000")),
        (1000, 0, false, Some("set spec.data.validation.everySteps above 0")),
        (250, 1000, false, Some("make spec.data.validation.everySteps divide spec.checkpoint.everySteps")),
        (1000, 1000, true, Some("a grpo run does not measure")),
    ];
    for (checkpoint, validation, grpo, error) in cases {
        let mut r = if grpo { grpo_run() } else { run() };
        r.spec.checkpoint.every_steps = checkpoint;
        r.spec.checkpoint.keep_best = 3;
        if let Some(d) = &mut r.spec.data {
            d.validation.every_steps = validation;
        }
        match error {
            None => assert_eq!(ok(&r).checkpoint.keep_best, 3),
            Some(words) => {
                fails(&r, "spec.checkpoint.keepBest", words);
            }
        }
    }
    // keepBest changes nothing that is trained: a resume may change it.
    let (a, mut b) = (ok(&run()), run());
    b.spec.checkpoint.keep_best = 2;
    assert_eq!(a.resume_view(), ok(&b).resume_view());
}

#[test]
fn topology_rules() {
    let mut r = run();
    r.spec.topology.nodes = 0;
    fails(&r, "spec.topology.nodes", "at least 1");
    let mut r = run();
    r.spec.topology.gpus_per_node = 1;
    r.spec.topology.gpu_resource_name = " ".into();
    fails(&r, "spec.topology.gpuResourceName", "must not be empty");
}

#[test]
fn grpo_rules() {
    ok(&grpo_run());
    let mut r = run();
    r.spec.grpo = Some(GrpoSpec::new("embedded:mcq"));
    fails(&r, "spec.grpo", "only allowed with phase grpo");
    let mut r = grpo_run();
    r.spec.grpo = None;
    fails(&r, "spec.grpo", "required for phase grpo");
    let mut r = grpo_run();
    r.spec.init_from = None;
    fails(&r, "spec.initFrom", "required for phase grpo");
    let mut r = grpo_run();
    r.spec.batch.global_tokens = Some(8192.into());
    fails(&r, "spec.batch.globalTokens", "not used in phase grpo");
    let mut r = grpo_run();
    r.spec.topology.gpus_per_node = 3;
    fails(&r, "spec.grpo.promptsPerStep", "8 prompts cannot be split evenly over 3 ranks");
    let mut r = grpo_run();
    r.spec.batch.micro_batch = 5;
    fails(&r, "spec.batch.microBatch", "5 does not divide the 128 completions");
    let edits: Vec<Edit<GrpoSpec>> = vec![
        (|g| g.generations_per_prompt = 1, "spec.grpo.generationsPerPrompt", "at least 2"),
        (|g| g.max_new_tokens = 256, "spec.grpo.maxNewTokens", "no room for the prompt"),
        (|g| g.temperature = 0.0, "spec.grpo.temperature", "positive"),
        (|g| g.top_p = 1.5, "spec.grpo.topP", "(0, 1]"),
        (|g| g.beta = -1.0, "spec.grpo.beta", "≥ 0"),
        (|g| g.clip_epsilon = 1.0, "spec.grpo.clipEpsilon", "(0, 1)"),
        (|g| g.length_penalty = -0.01, "spec.grpo.lengthPenalty", "≥ 0"),
        (|g| g.dataset = "http://x".into(), "spec.grpo.dataset", "unsupported scheme"),
        (|g| g.iterations = 0, "spec.grpo.iterations", "at least 1"),
        (|g| g.off_policy_mask_threshold = Some(-0.1), "spec.grpo.offPolicyMaskThreshold", "≥ 0"),
        (|g| g.eval_dataset = Some("ftp://x".into()), "spec.grpo.evalDataset", "unsupported scheme"),
        (
            |g| g.eval_datasets = vec!["embedded:mcq".into(), "embedded:mmlu".into()],
            "spec.grpo.evalDatasets[1]",
            "mcq-rules, mcq",
        ),
        (|g| g.eval_datasets = vec!["ftp://x".into()], "spec.grpo.evalDatasets[0]", "unsupported scheme"),
    ];
    for (edit, field, needle) in edits {
        let mut r = grpo_run();
        edit(r.spec.grpo.as_mut().unwrap());
        fails(&r, field, needle);
    }
    // Reusing a batch for 3 steps: a checkpoint every 1000 steps would split a batch.
    let mut r = grpo_run();
    r.spec.grpo.as_mut().unwrap().iterations = 3;
    fails(&r, "spec.checkpoint.everySteps", "not a multiple of grpo.iterations 3");
    r.spec.checkpoint.every_steps = 999;
    let g = ok(&r).grpo.unwrap();
    assert_eq!((g.iterations, g.eval_questions, g.eval_dataset), (3, 256, None));
    let grpo = r.spec.grpo.as_mut().unwrap();
    grpo.eval_dataset = Some("embedded:mcq-rules".into());
    grpo.eval_datasets = vec!["embedded:mcq".into(), "s3://bench/mmlu/test.parquet".into()];
    let g = ok(&r).grpo.unwrap();
    assert_eq!(g.eval_dataset, Some(Location::Embedded { name: "mcq-rules".into() }));
    assert_eq!(
        g.eval_datasets,
        vec![
            Location::Embedded { name: "mcq".into() },
            Location::S3 { bucket: "bench".into(), prefix: "mmlu/test.parquet".into() }
        ]
    );
}

#[test]
fn init_from_rules() {
    let mut r = run();
    r.spec.init_from = Some(InitFrom { training_run: Some("r".into()), uri: None });
    fails(&r, "spec.initFrom.trainingRun", "cannot start from itself");
    let mut r = run();
    r.spec.init_from = Some(InitFrom { training_run: Some("a".into()), uri: Some("s3://b/c".into()) });
    fails(&r, "spec.initFrom", "exactly one");
    let mut r = run();
    r.spec.init_from = Some(InitFrom { training_run: None, uri: Some("embedded:mcq".into()) });
    fails(&r, "spec.initFrom.uri", "hold no checkpoints");
    let mut r = run();
    r.spec.init_from = Some(InitFrom { training_run: None, uri: Some("pvc://ckpts/run-a/step-000100".into()) });
    assert_eq!(ok(&r).pvc_claims(), vec!["ckpts".to_string()]);
}

#[test]
fn data_parallel_settings() {
    let cfg = ok(&run());
    assert_eq!((cfg.topology.bucket_cap_mb, cfg.topology.collective_timeout_seconds), (25, 600));
    assert_eq!(cfg.topology.rendezvous_timeout_seconds(), 600, "the rendezvous waits as long as a collective");
    let mut r = run();
    r.spec.topology.collective_timeout = "90s".into();
    r.spec.topology.bucket_cap_mb = 100;
    let cfg = ok(&r);
    assert_eq!((cfg.topology.bucket_cap_mb, cfg.topology.collective_timeout_seconds), (100, 90));
    assert_eq!(
        cfg.topology.rendezvous_timeout_seconds(),
        crds::contract::RENDEZVOUS_JOIN_FLOOR_SECONDS,
        "a short collective timeout does not shorten the wait for pods that start apart"
    );
    let mut r = run();
    r.spec.topology.collective_timeout = "forever".into();
    fails(&r, "spec.topology.collectiveTimeout", "not a duration");
    let mut r = run();
    r.spec.topology.collective_timeout = "0s".into();
    fails(&r, "spec.topology.collectiveTimeout", "shorter than 1s");
    let mut r = run();
    r.spec.topology.bucket_cap_mb = 0;
    fails(&r, "spec.topology.bucketCapMB", "outside 1..=1024");
}

#[test]
fn lifecycle_rules() {
    let mut r = run();
    r.spec.failure_policy.stall_timeout = "soon".into();
    fails(&r, "spec.failurePolicy.stallTimeout", "not a duration");
    let mut r = run();
    r.spec.failure_policy.stall_timeout = "10s".into();
    fails(&r, "spec.failurePolicy.stallTimeout", "shorter than 1m");
    let mut r = run();
    r.spec.failure_policy.max_rollbacks = 257;
    fails(&r, "spec.failurePolicy.maxRollbacks", "more than the 256 rollbacks status can record");
    let mut r = run();
    r.spec.failure_policy.stall_timeout = "1h30m".into();
    assert_eq!(ok(&r).failure.stall_timeout_seconds, 5400);
    let mut r = run();
    r.spec.queue_name = Some("team a".into());
    fails(&r, "spec.queueName", "not a valid label value");
    let mut r = run();
    r.spec.ttl_seconds_after_finished = Some(-1);
    fails(&r, "spec.ttlSecondsAfterFinished", "negative");
}

#[test]
fn nan_rollback_policy() {
    // Defaults: fail; with rollback, 2 rollbacks at half the rate for one checkpoint interval.
    let mut r = run();
    r.spec.checkpoint.every_steps = 50;
    let f = ok(&r).failure;
    assert_eq!((f.on_nan, f.max_rollbacks, f.rollback_lr_factor), (OnNaN::Fail, 2, 0.5));
    assert_eq!((f.rollback_lr_steps, f.rollback_skip), (50, RollbackSkip::FailingStep));
    r.spec.failure_policy.on_nan = OnNaN::Rollback;
    r.spec.failure_policy.rollback_lr_steps = Some(7);
    r.spec.failure_policy.rollback_skip = RollbackSkip::SinceCheckpoint;
    let f = ok(&r).failure;
    assert_eq!((f.on_nan, f.rollback_lr_steps, f.rollback_skip), (OnNaN::Rollback, 7, RollbackSkip::SinceCheckpoint));
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        r.spec.failure_policy.rollback_lr_factor = bad;
        fails(&r, "spec.failurePolicy.rollbackLrFactor", "not in (0, 1]");
    }
    // The manifest's spelling.
    let yaml = "onNaN: rollback\nmaxRollbacks: 3\nrollbackLrFactor: 0.25\nrollbackSkip: sinceCheckpoint\n";
    let p: FailurePolicy = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!((p.on_nan, p.max_rollbacks, p.rollback_lr_factor), (OnNaN::Rollback, 3, 0.25));
    assert_eq!(p.rollback_skip, RollbackSkip::SinceCheckpoint);
}

#[test]
fn all_problems_are_reported_at_once() {
    let mut r = run();
    r.spec.model.preset = "huge".into();
    r.spec.tokens = "x".into();
    r.spec.checkpoint.keep_last = 0;
    let err = crds::resolve(&r).unwrap_err();
    for f in ["spec.model.preset", "spec.tokens", "spec.checkpoint.keepLast"] {
        assert!(err.names(f), "{f} missing from {err}");
    }
}

#[test]
fn env_cannot_override_the_contract() {
    let mut r = run();
    r.spec.env = vec![
        k8s_openapi::api::core::v1::EnvVar {
            name: "NCCL_DEBUG".into(),
            value: Some("INFO".into()),
            ..Default::default()
        },
        k8s_openapi::api::core::v1::EnvVar { name: "NODE_RANK".into(), value: Some("3".into()), ..Default::default() },
    ];
    fails(&r, "spec.env[1].name", "set by the operator");
    r.spec.env.truncate(1);
    ok(&r);
}

/// `schedule: wsd` warms up, holds lr, then decays to minLr over the last
/// `decayFraction` of the tokens after warmup; grown before the decay begins, the
/// budget changes nothing already trained.
#[test]
fn wsd_holds_lr_then_decays_and_a_grown_budget_changes_nothing_before_its_decay() {
    let wsd = |tokens: &str, shape: Option<DecayShape>| {
        let mut r = run();
        r.spec.tokens = tokens.into();
        r.spec.optimizer.schedule = Schedule::Wsd;
        r.spec.optimizer.warmup_tokens = Some("64K".into());
        r.spec.optimizer.decay_shape = shape;
        ok(&r).schedule
    };
    let s = wsd("1M", None);
    let (lr, min) = (s.lr, s.min_lr);
    // 999,424 tokens trained (122 steps of 8,192); warmup 65,536; decay over 0.2 of the rest.
    let span = ((s.total_tokens - s.warmup_tokens) as f64 * 0.2).round() as u64;
    let start = s.total_tokens - span;
    for (tokens, want) in [
        (s.warmup_tokens, lr),
        (start - 1, lr),
        (start, lr),
        (start + span / 2, lr - (lr - min) * ((span / 2) as f64 / span as f64)),
        (s.total_tokens, min),
        (s.total_tokens + 10_000, min),
    ] {
        assert!((s.lr_at(tokens) - want).abs() < 1e-12 * lr, "at {tokens}: {} vs {want}", s.lr_at(tokens));
    }
    let sqrt = wsd("1M", Some(DecayShape::OneMinusSqrt));
    let quarter = sqrt.lr_at(start + span / 4);
    let want = lr - (lr - min) * ((span / 4) as f64 / span as f64).sqrt();
    assert!((quarter - want).abs() < 1e-12 * lr, "1-sqrt at a quarter: {quarter} vs {want}");
    // A budget 20% larger: the same lr at every token before the first run's decay.
    let grown = wsd("1.2M", None);
    assert!(grown.total_tokens > s.total_tokens);
    for tokens in (0..start).step_by(8192) {
        assert_eq!(grown.lr_at(tokens), s.lr_at(tokens), "at {tokens}");
    }
    // Cosine, by contrast, already differs after warmup.
    let cosine = |tokens: &str| {
        let mut r = run();
        r.spec.tokens = tokens.into();
        r.spec.optimizer.warmup_tokens = Some("64K".into());
        ok(&r).schedule
    };
    assert_ne!(cosine("1M").lr_at(start / 2), cosine("1.2M").lr_at(start / 2));

    let mut r = run();
    r.spec.optimizer.schedule = Schedule::Wsd;
    for bad in [0.0, 1.5, f64::NAN] {
        r.spec.optimizer.decay_fraction = Some(bad);
        fails(&r, "spec.optimizer.decayFraction", "must be in (0, 1]");
    }
    let mut r = run();
    r.spec.optimizer.decay_fraction = Some(0.1);
    fails(&r, "spec.optimizer.decayFraction", "schedule: wsd only");
}
