//! `attention: auto`'s timing of each SDPA backend, and decoding under a forced backend.
//! One test in its own process: the SDPA switches are process-wide.

use crds::presets::{ModelConfig, preset};
use crds::types::Attention;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use trainer::ffi;
use trainer::kernels::attention::{CUDA_CANDIDATES, fastest, tune};
use trainer::kernels::sdp::set_sdp_backend;
use trainer::kernels::trials::tolerance;
use trainer::model::Model;

#[test]
fn auto_times_each_backend_and_decoding_runs_whatever_training_forced() {
    // nano: 4 query heads over 2 K/V heads, so both the GQA and the expanded path run.
    let cfg = ModelConfig::from(preset("nano").unwrap());
    assert_ne!(cfg.n_head, cfg.n_kv_head);
    for kind in [Kind::Float, Kind::BFloat16] {
        let candidates = [Attention::Flash, Attention::Math, Attention::Cudnn];
        let choice = tune(&cfg, 3, 40, kind, Device::Cpu, &candidates, None).unwrap();
        let [flash, math, cudnn] = &choice.trials[..] else { panic!("{choice:?}") };
        // CPU runs flash and math, each within the tolerance of f32 math; cuDNN cannot run.
        for t in [flash, math] {
            assert!(t.rejected.is_none(), "{kind:?}: {t:?}");
            assert!(t.ms.unwrap() > 0.0 && t.error.unwrap() <= tolerance(kind), "{kind:?}: {t:?}");
        }
        assert!(cudnn.rejected.as_deref().unwrap().starts_with("cannot run: spec.attention=cudnn"), "{cudnn:?}");
        assert_eq!(cudnn.ms, None);
        assert_eq!(choice.chosen, fastest(&choice.trials));
        assert!(matches!(choice.chosen, Attention::Flash | Attention::Math));
        // The switches are left on the chosen backend alone.
        let on = ffi::sdp_enabled().unwrap();
        assert_eq!(
            (on.flash, on.math, on.cudnn),
            (choice.chosen == Attention::Flash, choice.chosen == Attention::Math, false)
        );
        // f32 math against itself in f32 is exact to rounding.
        if kind == Kind::Float {
            assert!(math.error.unwrap() < 1e-6, "{math:?}");
        }
    }
    // No backend that can run: libtorch's own choice (auto), not an error.
    let none = tune(&cfg, 1, 8, Kind::Float, Device::Cpu, &[Attention::Cudnn], None).unwrap();
    assert_eq!(none.chosen, Attention::Auto);
    assert_eq!(CUDA_CANDIDATES, [Attention::Flash, Attention::Cudnn]);

    // Decoding's masked attention runs even when training forced a backend that cannot
    // run it (cuDNN on CPU here, as flash on CUDA), and leaves the switches as they were.
    tch::manual_seed(3);
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), &cfg, Device::Cpu).unwrap();
    let x = Tensor::from_slice(&[5i64, 17, 3, 8]).view([1, 4]);
    let real = Tensor::ones([1, 4], (Kind::Bool, Device::Cpu));
    set_sdp_backend(Attention::Auto).unwrap();
    let want = tch::no_grad(|| model.decode(&x, &real, &mut model.new_cache(1, 8).unwrap())).unwrap();
    set_sdp_backend(Attention::Cudnn).unwrap();
    let forced = ffi::sdp_enabled().unwrap();
    let got = tch::no_grad(|| model.decode(&x, &real, &mut model.new_cache(1, 8).unwrap())).unwrap();
    assert_eq!(ffi::sdp_enabled().unwrap(), forced);
    assert!((got - want).abs().max().double_value(&[]) < 1e-5);
    // …where the training forward under those switches has no backend at all.
    assert!(tch::no_grad(|| model.logits(&x)).is_err());
    set_sdp_backend(Attention::Auto).unwrap();
}
