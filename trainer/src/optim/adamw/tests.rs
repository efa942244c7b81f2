use super::*;
use serde_json::Value;
use std::time::Instant;
use tch::Device;

const GOLDEN: &str = include_str!("../../../tests/goldens/adamw.json");

/// The param formulas of scripts/goldens/adamw.py, in its order.
fn init_value(name: &str, i: usize) -> f64 {
    let x = i as f64;
    match name {
        "proj.weight" => 0.5 * (0.37 * x + 0.1).sin(),
        "norm.weight" => 1.0 + 0.1 * (0.5 * x).cos(),
        "proj.bias" => 0.05 * x - 0.15,
        "unused.weight" => 0.25 - 0.1 * x,
        _ => unreachable!("{name}"),
    }
}

const NAMES: [&str; 4] = ["proj.weight", "norm.weight", "proj.bias", "unused.weight"];

fn golden() -> Value {
    serde_json::from_str(GOLDEN).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn shape(g: &Value, name: &str) -> Vec<i64> {
    g["init"][name]["shape"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

fn fill(shape: &[i64], kind: Kind, f: impl Fn(usize) -> f64) -> Tensor {
    let n: i64 = shape.iter().product();
    let vals: Vec<f32> = (0..n as usize).map(|i| f(i) as f32).collect();
    Tensor::from_slice(&vals).reshape(shape).to_kind(kind)
}

fn config(g: &Value) -> ResolvedOptimizer {
    let c = &g["config"];
    ResolvedOptimizer {
        weight_decay: c["weight_decay"].as_f64().unwrap(),
        beta1: c["beta1"].as_f64().unwrap(),
        beta2: c["beta2"].as_f64().unwrap(),
        eps: c["eps"].as_f64().unwrap(),
        grad_clip: c["max_norm"].as_f64().unwrap(),
    }
}

fn golden_params(g: &Value, kind: Kind) -> Vec<(String, Tensor)> {
    NAMES
        .iter()
        .map(|&n| (n.to_string(), fill(&shape(g, n), kind, |i| init_value(n, i)).set_requires_grad(true)))
        .collect()
}

/// Gives every param but `unused.weight` the golden grad of `step` (1-based) through
/// a backward pass, so the unused param's grad stays undefined.
fn set_golden_grads(g: &Value, params: &[(String, Tensor)], opt: &mut AdamW, step: usize) {
    opt.zero_grad().unwrap();
    let scale = g["config"]["grad_scales"][step - 1].as_f64().unwrap();
    let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for (k, (name, p)) in params.iter().enumerate() {
        if name == "unused.weight" {
            continue;
        }
        let grad = fill(&p.size(), p.kind(), |i| scale * (0.23 * i as f64 + 0.7 * step as f64 + 1.3 * k as f64).cos());
        loss += (p * grad).sum(Kind::Float);
    }
    loss.backward();
}

fn max_abs_diff(t: &Tensor, want: &[f32]) -> f64 {
    let want = Tensor::from_slice(want).reshape(t.size());
    (t.to_kind(Kind::Float) - want).abs().max().double_value(&[])
}

fn run_golden(kind: Kind) -> (Vec<f64>, Vec<Vec<f64>>) {
    let g = golden();
    let params = golden_params(&g, kind);
    let mut opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
    let lr = g["config"]["lr"].as_f64().unwrap();
    let max_norm = g["config"]["max_norm"].as_f64().unwrap();
    let (mut norm_diffs, mut param_diffs) = (vec![], vec![]);
    for (s, want) in g["steps"].as_array().unwrap().iter().enumerate() {
        set_golden_grads(&g, &params, &mut opt, s + 1);
        let norm = opt.clip_grad_norm(max_norm).unwrap();
        assert_eq!(norm.kind(), Kind::Float);
        assert_eq!(norm.dim(), 0);
        norm_diffs.push((norm.double_value(&[]) - want["pre_clip_norm"].as_f64().unwrap()).abs());
        opt.step(lr).unwrap();
        param_diffs.push(params.iter().map(|(n, p)| max_abs_diff(p, &floats(&want["params"][n.as_str()]))).collect());
    }
    (norm_diffs, param_diffs)
}

#[test]
fn golden_inputs_match_the_python_formulas() {
    let g = golden();
    for (name, p) in golden_params(&g, Kind::Float) {
        assert_eq!(max_abs_diff(&p, &floats(&g["init"][name.as_str()]["values"])), 0.0, "{name}");
    }
}

#[test]
fn fused_adamw_and_clip_match_torch_f32() {
    let (norm_diffs, param_diffs) = run_golden(Kind::Float);
    eprintln!("pre-clip norm diffs {norm_diffs:?}, param diffs {param_diffs:?}");
    for (s, d) in norm_diffs.iter().enumerate() {
        assert!(*d <= 1e-6, "step {}: pre-clip norm off by {d}", s + 1);
    }
    for (s, diffs) in param_diffs.iter().enumerate() {
        for (name, d) in NAMES.iter().zip(diffs) {
            assert!(*d <= 1e-6, "step {}: {name} off by {d}", s + 1);
        }
    }
}

#[test]
fn bf16_params_step_without_nan_and_track_f32() {
    let (norm_diffs, param_diffs) = run_golden(Kind::BFloat16);
    // bf16 grads carry ~3 significant digits; the norm itself is accumulated in f32.
    for (s, d) in norm_diffs.iter().enumerate() {
        assert!(d.is_finite() && *d <= 0.05, "step {}: pre-clip norm off by {d}", s + 1);
    }
    for (s, diffs) in param_diffs.iter().enumerate() {
        for (name, d) in NAMES.iter().zip(diffs) {
            assert!(d.is_finite() && *d <= 1e-2, "step {}: {name} off by {d}", s + 1);
        }
    }
}

#[test]
fn bf16_state_keeps_param_dtype_and_stays_finite() {
    let g = golden();
    let params = golden_params(&g, Kind::BFloat16);
    let mut opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
    for s in 1..=3 {
        set_golden_grads(&g, &params, &mut opt, s);
        let _ = opt.clip_grad_norm(1.0).unwrap();
        opt.step(1e-3).unwrap();
    }
    for (name, t) in opt.state_tensors() {
        let want = if name.ends_with(".step") { Kind::Float } else { Kind::BFloat16 };
        assert_eq!(t.kind(), want, "{name}");
        let t = t.to_kind(Kind::Float);
        assert!(t.isfinite().all().int64_value(&[]) == 1, "{name} not finite");
        let nonzero = t.abs().sum(Kind::Float).double_value(&[]) > 0.0;
        assert_eq!(nonzero, !name.starts_with("unused."), "{name}");
    }
}

#[test]
fn unused_params_are_skipped_and_weight_decay_is_grouped() {
    let g = golden();
    let (_, param_diffs) = run_golden(Kind::Float);
    assert!(param_diffs.iter().all(|d| d[3] == 0.0), "unused.weight moved");
    let params = golden_params(&g, Kind::Float);
    let opt = AdamW::new(params, &config(&g)).unwrap();
    let decay: Vec<&str> = opt.decay.iter().map(|s| s.name.as_str()).collect();
    let no_decay: Vec<&str> = opt.no_decay.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(decay, ["proj.weight", "unused.weight"]);
    assert_eq!(no_decay, ["norm.weight", "proj.bias"]);
}

fn deep_copy(named: Vec<(String, Tensor)>) -> HashMap<String, Tensor> {
    named.into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
}

#[test]
fn state_round_trips_through_state_tensors() {
    let g = golden();
    let pa = golden_params(&g, Kind::Float);
    let mut a = AdamW::new(pa.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
    for s in 1..=2 {
        set_golden_grads(&g, &pa, &mut a, s);
        a.step(1e-3).unwrap();
    }
    let names: Vec<String> = a.state_tensors().into_iter().map(|(n, _)| n).collect();
    assert_eq!(&names[..3], ["norm.weight.exp_avg", "norm.weight.exp_avg_sq", "norm.weight.step"]);
    assert_eq!(names.len(), 12);
    let saved = deep_copy(a.state_tensors());
    assert_eq!(saved["proj.weight.step"].double_value(&[]), 2.0);
    assert_eq!(saved["unused.weight.step"].double_value(&[]), 0.0);

    // A fresh optimizer on copies of the params, with the saved state loaded,
    // must take the same third step.
    let pb: Vec<(String, Tensor)> =
        pa.iter().map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true))).collect();
    let mut b = AdamW::new(pb.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
    b.load_state(&saved).unwrap();
    for (opt, params) in [(&mut a, &pa), (&mut b, &pb)] {
        set_golden_grads(&g, params, opt, 3);
        opt.step(1e-3).unwrap();
    }
    for ((name, x), (_, y)) in pa.iter().zip(&pb) {
        assert!(x.equal(y), "{name} differs after resume");
    }
    for ((name, x), (_, y)) in a.state_tensors().iter().zip(b.state_tensors().iter()) {
        assert!(x.equal(y), "{name} differs after resume");
    }
}

#[test]
fn load_state_names_the_first_mismatch() {
    let g = golden();
    let mut opt = AdamW::new(golden_params(&g, Kind::Float), &config(&g)).unwrap();
    let good = deep_copy(opt.state_tensors());
    let before = deep_copy(opt.state_tensors());
    let err = |m: HashMap<String, Tensor>, opt: &mut AdamW| opt.load_state(&m).unwrap_err().to_string();

    let mut m = deep_copy(opt.state_tensors());
    m.insert("proj.bias.exp_avg_sq".into(), Tensor::zeros([8], (Kind::Float, Device::Cpu)));
    m.insert("proj.weight.exp_avg".into(), Tensor::ones([7, 5], (Kind::Float, Device::Cpu)));
    let e = err(m, &mut opt);
    assert!(e.contains("proj.bias.exp_avg_sq") && e.contains("[8]") && e.contains("[7]"), "{e}");
    // Nothing was copied: proj.weight.exp_avg (valid, but in a rejected load) is unchanged.
    for (n, t) in opt.state_tensors() {
        assert!(t.equal(&before[&n]), "{n} changed by a failed load");
    }

    let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
    m.insert("proj.weight.step".into(), Tensor::zeros([], (Kind::Double, Device::Cpu)));
    let e = err(m, &mut opt);
    assert!(e.contains("proj.weight.step") && e.contains("Double"), "{e}");

    let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
    m.remove("norm.weight.exp_avg");
    assert!(err(m, &mut opt).contains("norm.weight.exp_avg is missing"));

    let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
    m.insert("head.weight.exp_avg".into(), Tensor::zeros([1], (Kind::Float, Device::Cpu)));
    let e = opt.load_state(&m).unwrap_err();
    assert!(matches!(e, Error::OptimizerState(_)));
    assert!(e.to_string().contains("head.weight.exp_avg is not a parameter"), "{e}");
    assert_eq!(e.reason(), Some(crds::contract::FailureReason::InvalidConfig));

    opt.load_state(&good).unwrap();
}

/// Two parameters (one decayed, one not) and an optimizer over them.
fn toy() -> (Vec<(String, Tensor)>, AdamW) {
    let cfg = ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };
    let params = vec![
        ("a.weight".to_string(), fill(&[3, 4], Kind::Float, |i| (0.3 * i as f64).sin()).set_requires_grad(true)),
        ("b.bias".to_string(), fill(&[4], Kind::Float, |i| 0.1 * i as f64).set_requires_grad(true)),
    ];
    let opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &cfg).unwrap();
    (params, opt)
}

/// Backpropagates a loss whose gradient differs per step.
fn toy_backward(params: &[(String, Tensor)], opt: &mut AdamW, step: usize) {
    drop(toy_loss_backward(params, opt, step, 1.0));
}

/// [`toy_backward`] with every gradient scaled by `poison`; returns the loss.
fn toy_loss_backward(params: &[(String, Tensor)], opt: &mut AdamW, step: usize, poison: f64) -> Tensor {
    opt.zero_grad().unwrap();
    let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for (k, (_, p)) in params.iter().enumerate() {
        let w = fill(&p.size(), Kind::Float, |i| (0.7 * i as f64 + step as f64 + k as f64).cos());
        loss += (p * w).sum(Kind::Float) * poison;
    }
    loss.backward();
    loss.detach()
}

/// Parameters and optimizer state, copied.
fn snapshot(params: &[(String, Tensor)], opt: &AdamW) -> Vec<Tensor> {
    params
        .iter()
        .map(|(_, p)| p.detach().copy())
        .chain(opt.state_tensors().into_iter().map(|(_, t)| t.copy()))
        .collect()
}

fn same(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.equal(y))
}

/// zero_grad drops the gradients (no memory held between steps), and the next
/// backward starts from nothing rather than adding to the last one.
#[test]
fn zero_grad_drops_the_gradients() {
    let (params, mut opt) = toy();
    toy_backward(&params, &mut opt, 1);
    let first: Vec<Tensor> = params.iter().map(|(_, p)| p.grad().copy()).collect();
    opt.zero_grad().unwrap();
    assert!(params.iter().all(|(_, p)| !p.grad().defined()));
    opt.zero_grad().unwrap();
    toy_backward(&params, &mut opt, 1);
    for ((_, p), g) in params.iter().zip(&first) {
        assert!(p.grad().equal(g), "a fresh gradient, not a sum");
    }
}

#[test]
fn nonfinite_flags_nan_and_inf_anywhere() {
    let ok = Tensor::from_slice(&[1.0f32, -3.0]);
    let nan = Tensor::from_slice(&[1.0f32, f32::NAN]);
    let inf = Tensor::from(f32::NEG_INFINITY);
    let flag = |ts: &[&Tensor]| nonfinite(ts).unwrap();
    assert_eq!(flag(&[&ok]).kind(), Kind::Float);
    assert_eq!(flag(&[&ok]).dim(), 0);
    assert_eq!(flag(&[&ok, &Tensor::from(2.5f32)]).double_value(&[]), 0.0);
    assert_eq!(flag(&[&ok, &nan]).double_value(&[]), 1.0);
    assert_eq!(flag(&[&inf, &ok]).double_value(&[]), 1.0);
    assert!(nonfinite(&[]).is_err());
}

#[test]
fn a_tensor_learning_rate_and_a_zero_skip_flag_step_exactly_as_step_does() {
    let (pa, mut a) = toy();
    let (pb, mut b) = toy();
    let lr = Tensor::from(2e-2f32);
    let zero = Tensor::from(0.0f32);
    for step in 1..=3 {
        toy_backward(&pa, &mut a, step);
        a.step(f64::from(2e-2f32)).unwrap();
        toy_backward(&pb, &mut b, step);
        b.step_unless(Lr::Tensor(&lr), &zero).unwrap();
    }
    assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));
    assert_eq!(b.state_tensors().iter().find(|(n, _)| n == "a.weight.step").unwrap().1.double_value(&[]), 3.0);
}

#[test]
fn a_skipped_step_changes_nothing_and_training_goes_on_as_if_it_never_happened() {
    let (pa, mut a) = toy();
    let (pb, mut b) = toy();
    let one = Tensor::from(1.0f32);
    toy_backward(&pa, &mut a, 1);
    a.step(1e-2).unwrap();
    toy_backward(&pb, &mut b, 1);
    b.step(1e-2).unwrap();
    // b also sees a step whose update is skipped, step counts included.
    let before = snapshot(&pb, &b);
    toy_backward(&pb, &mut b, 7);
    b.step_unless(Lr::Value(1e-2), &one).unwrap();
    assert!(same(&before, &snapshot(&pb, &b)));
    toy_backward(&pa, &mut a, 2);
    a.step(1e-2).unwrap();
    toy_backward(&pb, &mut b, 2);
    b.step(1e-2).unwrap();
    assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));
}

#[test]
fn clip_and_step_skips_a_non_finite_loss_or_gradient_on_the_device() {
    // A finite step is clip_grad_norm then step.
    let (pa, mut a) = toy();
    let (pb, mut b) = toy();
    toy_backward(&pa, &mut a, 1);
    let norm_a = a.clip_grad_norm(1.0).unwrap();
    a.step(1e-2).unwrap();
    let loss = toy_loss_backward(&pb, &mut b, 1, 1.0);
    let (norm_b, skip) = b.clip_and_step(&loss, 1.0, Lr::Value(1e-2), None).unwrap();
    assert_eq!(skip.double_value(&[]), 0.0);
    assert!(norm_a.equal(&norm_b));
    assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));

    // NaN gradients (and so a NaN norm), or only a NaN loss: nothing changes.
    for (poison, loss_override) in [(f64::NAN, None), (1.0, Some(f32::NAN)), (f64::INFINITY, None)] {
        let before = snapshot(&pb, &b);
        let loss = toy_loss_backward(&pb, &mut b, 2, poison);
        let loss = loss_override.map_or(loss, Tensor::from);
        let (norm, skip) = b.clip_and_step(&loss, 1.0, Lr::Value(1e-2), None).unwrap();
        assert_eq!(skip.double_value(&[]), 1.0, "poison {poison}, loss {loss_override:?}");
        assert_eq!(norm.double_value(&[]).is_finite(), poison.is_finite());
        assert!(same(&before, &snapshot(&pb, &b)), "poison {poison}, loss {loss_override:?}");
    }
}

#[test]
fn clip_returns_non_finite_norms() {
    let g = Tensor::from_slice(&[3.0f32, 4.0]);
    let h = Tensor::from_slice(&[12.0f32]);
    let norm = ffi::clip_grad_norm(&[g.shallow_clone(), h.shallow_clone()], 1.0).unwrap();
    assert!((norm.double_value(&[]) - 13.0).abs() < 1e-5);
    assert!((g.double_value(&[1]) - 4.0 / (13.0 + 1e-6)).abs() < 1e-6);
    // Below max_norm nothing is scaled.
    let n2 = ffi::clip_grad_norm(&[g.shallow_clone()], 100.0).unwrap();
    assert!((g.double_value(&[0]) - 3.0 / 13.0).abs() < 1e-6, "{}", n2.double_value(&[]));

    let bad = Tensor::from_slice(&[1.0f32, f32::INFINITY]);
    assert_eq!(ffi::clip_grad_norm(&[bad], 1.0).unwrap().double_value(&[]), f64::INFINITY);
    let nan = Tensor::from_slice(&[f32::NAN]);
    assert!(ffi::clip_grad_norm(&[nan], 1.0).unwrap().double_value(&[]).is_nan());
}

#[test]
fn shim_errors_come_back_as_errors() {
    let e = ffi::clip_grad_norm(&[], 1.0).unwrap_err();
    assert!(matches!(e, Error::Shim(_)) && e.to_string().contains("at least one gradient"), "{e}");
    let undefined = Tensor::new();
    let e = ffi::clip_grad_norm(&[undefined], 1.0).unwrap_err();
    assert!(e.to_string().contains("grads[0] is undefined"), "{e}");
    // A param and grad of different sizes are rejected by ATen, not a crash.
    let p = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let grad = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    let m = p.zeros_like();
    let v = p.zeros_like();
    let s = Tensor::zeros([], (Kind::Float, Device::Cpu));
    let hp = AdamWParams { lr: Lr::Value(1e-3), beta1: 0.9, beta2: 0.95, weight_decay: 0.0, eps: 1e-8 };
    let e = ffi::fused_adamw(&[p], &[grad], &[m], &[v], &[s], &hp, None).unwrap_err();
    assert!(matches!(e, Error::Shim(_)) && e.to_string().contains("fused_adamw: param 0 is [2, 3]"), "{e}");
}

/// ms/step of the fused AdamW against tch's nn::AdamW (libtorch's C++ optimizer)
/// on ~10M f32 params on CPU: `cargo test -p trainer --release --lib -- --ignored
/// --nocapture bench_fused_adamw`.
#[test]
#[ignore]
fn bench_fused_adamw_vs_tch() {
    use tch::nn::{self, OptimizerConfig};
    let shapes: Vec<Vec<i64>> = std::iter::once(vec![4096, 512])
        .chain((0..8).map(|_| vec![512, 1536]))
        .chain((0..6).map(|_| vec![512, 512]))
        .chain((0..16).map(|_| vec![512]))
        .collect();
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for (i, s) in shapes.iter().enumerate() {
        let p = root.var(&format!("p{i}"), s, nn::Init::Uniform { lo: -0.1, up: 0.1 });
        loss += (&p * p.randn_like()).sum(Kind::Float);
    }
    loss.backward();
    let n: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    let cfg = ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };
    let mut fused = AdamW::new(vs.variables(), &cfg).unwrap();
    let mut tch_opt =
        nn::AdamW { beta1: 0.9, beta2: 0.95, wd: 0.1, eps: 1e-8, amsgrad: false }.build(&vs, 1e-4).unwrap();
    // Interleaved single-step timings, so a noisy shared machine slows both alike;
    // the minimum and the median are reported.
    let ms = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut f_ms, mut t_ms, mut c_ms) = (vec![], vec![], vec![]);
    for i in 0..33 {
        let (f, t, c) = (
            ms(&mut || fused.step(1e-4).unwrap()),
            ms(&mut || tch_opt.step()),
            ms(&mut || drop(fused.clip_grad_norm(1e9).unwrap())),
        );
        if i >= 3 {
            f_ms.push(f);
            t_ms.push(t);
            c_ms.push(c);
        }
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("min {:.2} / median {:.2} ms", v[0], v[v.len() / 2])
    };
    println!(
        "{n} f32 params, {} threads: fused AdamW {}, tch nn::AdamW {}, clip_grad_norm {}",
        tch::get_num_threads(),
        stats(&mut f_ms),
        stats(&mut t_ms),
        stats(&mut c_ms),
    );
}
