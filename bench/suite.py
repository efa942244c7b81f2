#!/usr/bin/env python3
"""`make bench`: the project's performance figures, each as a ratio against the tool a
user would pick instead, both sides measured back to back in this one run, on this
machine, with the same threads. Absolute times between runs are not comparable here;
the ratios are.

    bench/suite.sh [--smoke] [--only step,memory,...] [--json FILE]

Rows (the peer in brackets):
  step      training step time, CPU f32, median of the timed steps [PyTorch eager, torch.compile]
  memory    peak host tensor bytes of a step, counted at libtorch's CPU allocator by the same
            code on both sides (trainer/csrc/memory.cpp), and the largest micro-batch under a cap
            [PyTorch eager, torch.compile]
  generate  GRPO's greedy sampler on the same exported weights and prompts; outputs must be
            identical [Hugging Face transformers' generate, use_cache=True]
  checkpoint the time a periodic checkpoint (model + AdamW state) blocks training
            [a synchronous torch.save of the same state dicts, to the same disk]
  prepare   `trainer prepare` MB/s on the same corpus and tokenizer [HF tokenizers encode_batch]
  loader    the data loader's tokens/s on one core through the 45/25/20/10 mix [the 50M/s goal,
            and a plain sequential u16 -> i64 pass in the same process]
  operator  10,000 TrainingRuns on the real control plane with 1,000 kwok nodes: the leader's
            peak RSS, edit → status p99, requests/s once settled [the goals]

`--smoke` (CI, from scripts/test.sh) runs every row at toy sizes: it checks that the suite
still works end to end, that the compile peer compiles, and that the sampler's outputs
still equal Hugging Face's; its figures mean nothing.

The peers run as `suite.py peer-*` subprocesses of the same Python, one per measurement.
"""
import argparse
import ctypes
import datetime
import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The trainer's presets that the PyTorch reference does not list, in its tuple layout
# (arch, layers, d_model, n_head, n_kv_head, d_head, d_ff, vocab, rope_theta, tied); the
# suite checks their parameter counts against `trainer presets --json` before use.
EXTRA_PRESETS = {
    "nano": ("llama", 2, 128, 4, 2, 32, 384, 2048, 1e4, False),
    "micro": ("llama", 6, 384, 6, 2, 64, 768, 2048, 1e4, False),
}

# Every size the rows use: the full suite's, and --smoke's.
SIZES = {
    "full": {
        "step": [("micro", 8, 256), ("tiny", 2, 512)], "step_steps": 10, "step_warmup": 3,
        "memory": ("tiny", 4, 1024), "memory_cap": ("tiny", 512, 4.0),
        "generate": [("nano", 32, 48, 192), ("micro", 32, 48, 192)], "generate_repeats": 3,
        "checkpoint": [("tiny", 1, 256, 12, 4), ("small", 1, 128, 12, 4)], "save_repeats": 3,
        "prepare_mb": 64, "loader_batches": 2000, "loader_tokens": "32M", "operator_runs": 10000, "operator_nodes": 1000, "operator_window_s": 30,
    },
    "smoke": {
        "step": [("nano", 2, 64)], "step_steps": 3, "step_warmup": 1,
        "memory": ("nano", 2, 64), "memory_cap": ("nano", 64, 0.02),
        "generate": [("nano", 4, 8, 16)], "generate_repeats": 1,
        "checkpoint": [("nano", 1, 32, 4, 2)], "save_repeats": 1,
        "prepare_mb": 1, "loader_batches": 50, "loader_tokens": "1M", "operator_runs": 200, "operator_nodes": 30, "operator_window_s": 5,
    },
}


def load_reference():
    path = os.path.join(HERE, "torch_reference.py")
    spec = importlib.util.spec_from_file_location("torch_reference", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    for name, dims in EXTRA_PRESETS.items():
        ref.PRESETS.setdefault(name, dims)
    return ref


# ---------------------------------------------------------------------------------------
# Peers: each runs in its own process and prints one JSON object.

class HostMemory:
    """trainer/csrc/memory.cpp, built against this Python's torch: the allocator-level
    count (and cap) of this thread's host tensor bytes that `trainer bench --host-memory`
    uses."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        for name in ("shim_host_memory_count", "shim_host_memory", "shim_host_memory_reset_peak",
                     "shim_host_memory_limit"):
            getattr(self.lib, name).restype = ctypes.c_void_p
        self.lib.shim_host_memory_limit.argtypes = [ctypes.c_int64]

    def _check(self, what, err):
        if err:
            raise RuntimeError(f"{what}: {ctypes.string_at(err).decode()}")

    def count(self, on):
        self._check("count", self.lib.shim_host_memory_count(1 if on else 0))

    def limit(self, nbytes):
        self._check("limit", self.lib.shim_host_memory_limit(int(nbytes)))

    def read(self):
        cur, peak = ctypes.c_int64(), ctypes.c_int64()
        self._check("read", self.lib.shim_host_memory(ctypes.byref(cur), ctypes.byref(peak)))
        return cur.value, peak.value

    def reset_peak(self):
        self._check("reset", self.lib.shim_host_memory_reset_peak())


def peer_step(a):
    """The reference's training step (forward, backward, clip, AdamW), eager or compiled,
    each step timed; optionally its host memory at the allocator."""
    import torch
    torch.set_num_threads(a.threads)
    hm = HostMemory(a.host_memory) if a.host_memory else None
    if hm:
        hm.count(True)
        if a.limit_bytes:
            hm.limit(a.limit_bytes)
    ref = load_reference()
    cfg = ref.Cfg(a.preset, a.seq)
    out = {"impl": "torch-compile" if a.compile else "torch-eager", "preset": a.preset,
           "micro_batch": a.micro_batch, "seq": a.seq, "torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        torch.manual_seed(0)
        model = ref.Model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        fn = torch.compile(model) if a.compile else model

        def step():
            idx = torch.randint(0, cfg.vocab, (a.micro_batch, cfg.seq + 1))
            loss = fn(idx[:, :-1], idx[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        out["params"] = sum(p.numel() for p in model.parameters())
        started = time.perf_counter()
        for _ in range(a.warmup):
            step()
        out["warmup_s"] = time.perf_counter() - started
        resident = hm.read()[0] if hm else None
        if hm:
            hm.reset_peak()
        times = []
        for _ in range(a.steps):
            t = time.perf_counter()
            loss = step()
            times.append(1000 * (time.perf_counter() - t))
    except torch.OutOfMemoryError as e:
        out.update(oom=True, error=str(e).splitlines()[0])
        print(json.dumps(out))
        return
    out.update(step_ms_median=statistics.median(times), step_times_ms=[round(t, 2) for t in times],
               final_loss=float(loss))
    if hm:
        out.update(host_peak_bytes=hm.read()[1], host_resident_bytes=resident)
    if a.compile:
        from torch._dynamo.utils import counters
        out["graph_breaks"] = sum(counters["graph_break"].values())
        out["graph_break_reasons"] = sorted(counters["graph_break"])
        out["graphs_compiled"] = counters["stats"]["unique_graphs"]
    print(json.dumps(out))


def peer_generate(a):
    """Hugging Face `generate`, greedy with the KV cache, on the trainer's exported model
    and prompts; the outputs are compared with the trainer's. On CUDA with
    `--cache static`, HF's static cache, which `generate` compiles by itself on CUDA."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    torch.set_num_threads(a.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=dtype, attn_implementation="sdpa").to(a.device).eval()
    ours = json.load(open(os.path.join(a.dir, "generate.json")))
    prompts = torch.tensor(ours["prompts"], dtype=torch.long, device=a.device)
    new = len(ours["outputs"][0])
    # No end-of-text: both sides decode exactly `new` tokens, with nothing suppressed.
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    extra = {"cache_implementation": "static"} if a.cache == "static" else {}
    gc = GenerationConfig(max_new_tokens=new, do_sample=False, use_cache=True, eos_token_id=None,
                          pad_token_id=0, num_beams=1, **extra)
    mask = torch.ones_like(prompts)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def run(n):
        with torch.inference_mode():
            out = model.generate(prompts, attention_mask=mask, generation_config=gc, max_new_tokens=n,
                                 return_dict_in_generate=True)
        sync()
        return out

    t = time.perf_counter()
    # The warm-up decodes as many tokens as the timed runs: a static cache is sized by
    # the whole length, and its compiled step by the cache's shape.
    warm = run(new if a.cache == "static" else min(4, new))
    warm_s = time.perf_counter() - t
    times, out = [], None
    for _ in range(a.repeats):
        t = time.perf_counter()
        out = run(new)
        times.append(time.perf_counter() - t)
    seqs = out.sequences[:, prompts.shape[1]:].tolist()
    identical = sum(1 for mine, theirs in zip(ours["outputs"], seqs) if mine == theirs)
    first_diff = next(([r, next(i for i, (x, y) in enumerate(zip(m, t)) if x != y)]
                       for r, (m, t) in enumerate(zip(ours["outputs"], seqs)) if m != t), None)
    print(json.dumps({
        "impl": "transformers-generate", "class": type(model).__name__,
        "attn_implementation": model.config._attn_implementation,
        "device": a.device, "dtype": a.dtype, "cache": a.cache, "warmup_s": warm_s,
        "use_cache": gc.use_cache, "kv_cache_used": out.past_key_values is not None and warm.past_key_values is not None,
        "threads": torch.get_num_threads(), "rows": len(seqs), "new_tokens": new,
        "tokens_per_s": len(seqs) * new / statistics.median(times), "runs_s": times,
        "identical_rows": identical, "first_difference": first_diff,
    }))


def peer_save(a):
    """A synchronous torch.save of the reference model's and AdamW's state dicts (after
    one step, so the optimizer holds its moments) into the trainer's checkpoint disk."""
    import torch
    torch.set_num_threads(a.threads)
    ref = load_reference()
    torch.manual_seed(0)
    cfg = ref.Cfg(a.preset, a.seq)
    model = ref.Model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, cfg.vocab, (1, cfg.seq + 1))
    model(idx[:, :-1], idx[:, 1:]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "checkpoint.pt")
    saves, synced = [], []
    for _ in range(a.repeats):
        if os.path.exists(path):
            os.remove(path)
        t = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        saves.append(time.perf_counter() - t)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        synced.append(time.perf_counter() - t)
    size = os.path.getsize(path)
    os.remove(path)
    print(json.dumps({"impl": "torch.save", "preset": a.preset, "bytes": size,
                      "save_ms_median": 1000 * statistics.median(saves),
                      "save_and_fsync_ms_median": 1000 * statistics.median(synced)}))


def peer_tokenize(a):
    """Hugging Face tokenizers' encode_batch over the same jsonl, 1,000 documents a batch."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    start = time.perf_counter()
    n_bytes, n_tokens, batch = 0, 0, []

    def flush():
        nonlocal n_tokens
        for e in tok.encode_batch(batch, add_special_tokens=False):
            n_tokens += len(e.ids) + 1
        batch.clear()
    with open(a.input) as f:
        for line in f:
            n_bytes += len(line)
            batch.append(json.loads(line)["text"])
            if len(batch) == 1000:
                flush()
    flush()
    dt = time.perf_counter() - start
    print(json.dumps({"impl": "tokenizers.encode_batch", "bytes": n_bytes, "tokens": n_tokens, "seconds": dt,
                      "mb_per_s": n_bytes / 1e6 / dt, "cores": os.cpu_count()}))


# ---------------------------------------------------------------------------------------
# The suite.

class Suite:
    def __init__(self, a):
        self.a = a
        self.sizes = SIZES["smoke" if a.smoke else "full"]
        self.trainer = a.trainer
        self.python = sys.executable
        self.threads = a.threads
        self.work = tempfile.mkdtemp(prefix="bench-suite-", dir=a.work)
        self.rows = []
        self.failures = []
        self.env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), RUST_LOG="warn")

    # Processes ----------------------------------------------------------------------
    def run_json(self, cmd, allow_fail=False, cwd=None):
        """Runs `cmd`, returns the last line of its stdout that is a JSON object."""
        shown = " ".join(shlex.quote(c) for c in cmd)
        print(f"  $ {shown}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=cwd)
        if p.returncode != 0 and not allow_fail:
            raise RuntimeError(f"{shown} exited {p.returncode}:\n{p.stderr[-3000:]}")
        for line in reversed(p.stdout.splitlines()):
            line = line.removeprefix("BENCH_JSON ").strip()
            if line.startswith("{"):
                out = json.loads(line)
                out["_command"] = shown
                out["_rc"] = p.returncode
                out["_stderr"] = p.stderr[-2000:]
                return out
        if allow_fail:
            return {"_command": shown, "_rc": p.returncode, "_stderr": p.stderr[-2000:]}
        raise RuntimeError(f"{shown}: no JSON on stdout:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")

    def peer(self, kind, *args):
        return [self.python, os.path.abspath(__file__), kind, "--threads", str(self.threads), *map(str, args)]

    def ours(self, *args):
        return [self.trainer, *map(str, args)]

    # Recording ----------------------------------------------------------------------
    def row(self, name, what, ours, peer, peer_value, ratio, goal, met, command, note=""):
        load = os.getloadavg()[0]
        r = {"row": name, "what": what, "ours": ours, "peer": peer, "peer_value": peer_value,
             "ratio": ratio, "goal": goal, "met": met, "command": command, "load": round(load, 2), "note": note}
        self.rows.append(r)
        mark = "–" if met is None else "ok" if met else "MISSED"
        print(f"[{name}] {what}: {ratio} ({goal}) {mark}  (load {load:.2f})", file=sys.stderr, flush=True)

    def check(self, ok, message):
        if not ok:
            self.failures.append(message)
            print(f"FAILED: {message}", file=sys.stderr, flush=True)
        return ok

    # Rows ---------------------------------------------------------------------------
    def check_presets(self):
        """The peer's models are the trainer's: same parameter counts for every preset used."""
        p = subprocess.run(self.ours("presets", "--json"), capture_output=True, text=True, check=True)
        ours = {r["preset"]: r["params"] for r in map(json.loads, p.stdout.splitlines())}
        ref = load_reference()
        import torch
        used = {s[0] for key in ("step", "generate", "checkpoint") for s in self.sizes[key]}
        used |= {self.sizes["memory"][0], self.sizes["memory_cap"][0]}
        for name in sorted(used):
            with torch.device("meta"):
                theirs = sum(p.numel() for p in ref.Model(ref.Cfg(name, 256)).parameters())
            self.check(ours.get(name) == theirs, f"preset {name}: trainer has {ours.get(name)} parameters, "
                                                 f"the reference {theirs}")

    def step(self):
        steps, warmup = self.sizes["step_steps"], self.sizes["step_warmup"]
        for preset, mb, seq in self.sizes["step"]:
            shape = ["--preset", preset, "--micro-batch", mb, "--seq", seq, "--steps", steps, "--warmup", warmup]
            ours = self.run_json(self.ours("bench", "--device", "cpu", "--precision", "f32", *shape))
            eager = self.run_json(self.peer("peer-step", *shape))
            compiled = self.run_json(self.peer("peer-step", *shape, "--compile"))
            self.check(ours["threads"] == eager["threads"] == compiled["threads"] == self.threads,
                       f"step {preset}: threads differ: {ours['threads']}, {eager['threads']}, {compiled['threads']}")
            self.check(compiled["graphs_compiled"] >= 1, f"step {preset}: torch.compile compiled no graph")
            mine = ours["step_ms_median"]
            for peer, goal in ((eager, 0.9), (compiled, 1.0)):
                ratio = mine / peer["step_ms_median"]
                note = ""
                if peer is compiled:
                    note = f"{compiled['graphs_compiled']} graph(s), {compiled['graph_breaks']} graph break(s)"
                self.row("step", f"{preset} {mb}×{seq} step time, ms", round(mine, 1),
                         f"PyTorch {peer['impl'].split('-')[1]}", round(peer["step_ms_median"], 1),
                         round(ratio, 3), f"≤ {goal}", ratio <= goal,
                         f"{ours['_command']}  vs  {peer['_command']}", note)

    def memory(self):
        preset, mb, seq = self.sizes["memory"]
        shape = ["--preset", preset, "--micro-batch", mb, "--seq", seq, "--steps", 1, "--warmup", 1]
        ours = self.run_json(self.ours("bench", "--device", "cpu", "--precision", "f32", "--host-memory", *shape))
        for compile_ in (False, True):
            peer = self.run_json(self.peer("peer-step", *shape, "--host-memory", self.a.hostmem,
                                           *(["--compile"] if compile_ else [])))
            ratio = ours["host_peak_bytes"] / peer["host_peak_bytes"]
            goal = 0.75 if not compile_ else None
            self.row("memory", f"{preset} {mb}×{seq} step peak, MiB (resident {ours['host_resident_bytes'] / 2**20:.0f}"
                     f" vs {peer['host_resident_bytes'] / 2**20:.0f})",
                     round(ours["host_peak_bytes"] / 2**20, 1), f"PyTorch {peer['impl'].split('-')[1]}",
                     round(peer["host_peak_bytes"] / 2**20, 1), round(ratio, 3),
                     f"≤ {goal}" if goal else "–", None if goal is None else ratio <= goal,
                     f"{ours['_command']}  vs  {peer['_command']}")
        self.largest_micro_batch()

    def largest_micro_batch(self):
        preset, seq, cap_gib = self.sizes["memory_cap"]
        cap = int(cap_gib * 2**30)

        def fits_ours(b):
            r = self.run_json(self.ours("bench", "--device", "cpu", "--precision", "f32", "--host-memory",
                                        "--host-memory-limit-gib", cap_gib, "--preset", preset, "--micro-batch", b,
                                        "--seq", seq, "--steps", 1, "--warmup", 1), allow_fail=True)
            if r["_rc"] != 0 and "host memory limit" not in r["_stderr"]:
                raise RuntimeError(f"{r['_command']} failed, not for memory:\n{r['_stderr']}")
            return r["_rc"] == 0, r["_command"]

        def fits_eager(b):
            r = self.run_json(self.peer("peer-step", "--preset", preset, "--micro-batch", b, "--seq", seq,
                                        "--steps", 1, "--warmup", 1, "--host-memory", self.a.hostmem,
                                        "--limit-bytes", cap))
            return not r.get("oom"), r["_command"]

        found = {}
        for side, fits in (("ours", fits_ours), ("eager", fits_eager)):
            found[side] = largest(fits)
        (ours, ours_cmd), (eager, eager_cmd) = found["ours"], found["eager"]
        ratio = ours / eager if eager else float("inf")
        self.row("memory", f"{preset} at seq {seq}: largest micro-batch under {cap_gib} GiB of host tensors",
                 ours, "PyTorch eager", eager, round(ratio, 2), "≥ 1", ratio >= 1,
                 f"{ours_cmd}  vs  {eager_cmd}")

    def generate(self):
        for preset, batch, prompt, new in self.sizes["generate"]:
            d = os.path.join(self.work, f"hf-{preset}")
            ours = self.run_json(self.ours("bench-generate", "--device", "cpu", "--preset", preset, "--batch", batch,
                                           "--prompt-tokens", prompt, "--new-tokens", new, "--repeats",
                                           self.sizes["generate_repeats"], "--no-full-prefix", "--hf-dir", d))
            hf = self.run_json(self.peer("peer-generate", "--dir", d, "--repeats", self.sizes["generate_repeats"]))
            self.check(hf["use_cache"] and hf["kv_cache_used"], f"generate {preset}: HF decoded without its KV cache")
            same = self.check(hf["identical_rows"] == batch,
                              f"generate {preset}: greedy outputs differ from Hugging Face's in "
                              f"{batch - hf['identical_rows']} of {batch} rows (first at row, token "
                              f"{hf['first_difference']})")
            ratio = ours["kv_cache_tokens_per_s"] / hf["tokens_per_s"]
            self.row("generate", f"{preset} {batch} rows × {new} new tokens, greedy, tokens/s",
                     round(ours["kv_cache_tokens_per_s"]), "HF generate (use_cache)", round(hf["tokens_per_s"]),
                     round(ratio, 3), "≥ 1.5", ratio >= 1.5 and same, f"{ours['_command']}  vs  {hf['_command']}",
                     f"outputs identical in {hf['identical_rows']}/{batch} rows; HF {hf['class']}, "
                     f"{hf['attn_implementation']}")

    def checkpoint(self):
        for preset, mb, seq, steps, every in self.sizes["checkpoint"]:
            d = os.path.join(self.a.disk, f"bench-checkpoint-{os.getpid()}")
            ours = self.run_json(self.ours("bench-checkpoint", "--preset", preset, "--micro-batch", mb, "--seq", seq,
                                           "--steps", steps, "--every", every, "--dir", d))
            saved = self.run_json(self.peer("peer-save", "--preset", preset, "--seq", seq, "--dir", d,
                                             "--repeats", self.sizes["save_repeats"]))
            shutil.rmtree(d, ignore_errors=True)
            stall = ours["stall_ms_per_checkpoint"]
            ratio = stall / saved["save_ms_median"]
            self.row("checkpoint", f"{preset} ({ours['checkpoint_bytes'] / 1e6:.0f} MB) training blocked per "
                     f"checkpoint, ms", round(stall, 1), "torch.save (sync)", round(saved["save_ms_median"], 1),
                     round(ratio, 3), "≤ 0.1", ratio <= 0.1, f"{ours['_command']}  vs  {saved['_command']}",
                     f"ours: blocked {ours['blocked_ms_per_checkpoint']:.1f} ms, steps slowed "
                     f"{ours['added_ms_per_checkpoint']:.1f} ms, write fsynced and renamed; "
                     f"our synchronous save {ours['sync_save_ms']:.0f} ms; torch.save + fsync "
                     f"{saved['save_and_fsync_ms_median']:.0f} ms")

    def prepare(self):
        d = os.path.join(self.work, "prepare")
        os.makedirs(d)
        corpus = os.path.join(d, "input.jsonl")
        write_corpus(corpus, self.sizes["prepare_mb"])
        tok = os.path.join(d, "tok")
        subprocess.run(self.ours("prepare", "-i", corpus, "--train-tokenizer", "--vocab-size", 32768,
                                 "--tokenizer-sample-bytes", "16M", "--shard-tokens", "1M",
                                 "--validation-fraction", 0, "-o", tok),
                       check=True, capture_output=True, env=self.env)
        cmd = self.ours("prepare", "-i", corpus, "--tokenizer", os.path.join(tok, "tokenizer.json"),
                        "--validation-fraction", 0.005, "-o", os.path.join(d, "out"))
        p = subprocess.run(cmd, check=True, capture_output=True, text=True, env=self.env)
        m = re.search(r"\(([0-9.]+) MB/s\)", p.stdout)
        if not self.check(m is not None, f"trainer prepare printed no MB/s: {p.stdout}"):
            return
        ours = float(m.group(1))
        peer = self.run_json(self.peer("peer-tokenize", "--input", corpus, "--tokenizer",
                                       os.path.join(tok, "tokenizer.json")))
        ratio = ours / peer["mb_per_s"]
        self.row("prepare", f"{self.sizes['prepare_mb']} MB of text, 32K BPE, all {os.cpu_count()} cores, MB/s",
                 round(ours, 1), "HF tokenizers encode_batch", round(peer["mb_per_s"], 1), round(ratio, 2), "≥ 1.5",
                 ratio >= 1.5, f"{' '.join(map(str, cmd))}  vs  {peer['_command']}")

    def loader(self):
        r = self.run_json(self.ours("bench-data", "--batches", self.sizes["loader_batches"],
                                    "--synthetic-tokens", self.sizes["loader_tokens"]))
        ours = r["tokens_per_s_tensor"]
        self.row("loader", "mix → token tensors, one core, M tokens/s", round(ours / 1e6, 1), "the 50M/s goal",
                 50.0, round(ours / 50e6, 2), "≥ 1", ours >= 50e6, r["_command"],
                 f"a plain sequential u16 → i64 pass in the same process: "
                 f"{r['tokens_per_s_sequential_copy'] / 1e6:.0f}M/s ({ours / r['tokens_per_s_sequential_copy']:.2f}×)")

    def operator(self):
        env = dict(self.env, BENCH_RUNS=str(self.sizes["operator_runs"]), BENCH_NODES=str(self.sizes["operator_nodes"]),
                   BENCH_WINDOW_S=str(self.sizes["operator_window_s"]))
        cmd = self.a.operator_bench
        shown = f"BENCH_RUNS={env['BENCH_RUNS']} BENCH_NODES={env['BENCH_NODES']} BENCH_WINDOW_S={env['BENCH_WINDOW_S']} {cmd}"
        print(f"  $ {shown}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((l for l in reversed(p.stdout.splitlines()) if l.startswith("BENCH_JSON ")), None)
        if not self.check(p.returncode == 0 and line, f"operator bench failed ({p.returncode}):\n{p.stderr[-3000:]}"):
            return
        r = json.loads(line.removeprefix("BENCH_JSON "))
        what = f"{r['runs']} runs on {r['nodes']} kwok nodes"
        self.row("operator", f"{what}: leader's peak RSS, MiB", round(r["peak_rss_mib"], 1),
                 "goal", r["rss_goal_mib"], round(r["peak_rss_mib"] / r["rss_goal_mib"], 3), "≤ 1",
                 r["peak_rss_mib"] <= r["rss_goal_mib"], shown,
                 f"fates shown {r['admission_s']:.1f} s after the first create; settled {r['settle_s']:.1f} s after the freeze")
        self.row("operator", f"{what}: edit → status p99, s", round(r["edit_p99_s"], 3), "goal",
                 r["p99_goal_s"], round(r["edit_p99_s"] / r["p99_goal_s"], 3), "≤ 1",
                 r["edit_p99_s"] <= r["p99_goal_s"], shown,
                 f"p50 {r['edit_p50_s']:.3f} s; killed pod → next attempt p50/p99 {r['restart_p50_s']:.2f}/{r['restart_p99_s']:.2f} s")
        rate, goal = r["settled_requests_per_s"], r["settled_goal_per_s"]
        self.row("operator", f"{what}, settled: requests/s beyond the watches", round(rate, 2), "goal", round(goal, 2),
                 round(rate / goal, 3) if goal else None, "≤ 1", rate <= goal, shown,
                 f"writes {r['settled_writes']} (goal 0); {r['settled_requests']}")
        peer = r.get("peer")
        if peer:
            self.operator_peer(what, r, peer, shown)

    def operator_peer(self, what, r, peer, shown):
        """JobSet's controller given the same shapes (BENCH_PEER=jobset): ours over its."""
        ratio = lambda a, b: round(a / b, 3) if b else None
        self.row("operator", f"{what}: leader's peak RSS against JobSet's controller's, MiB", round(r["peak_rss_mib"], 1),
                 "JobSet", round(peer["peak_rss_mib"], 1), ratio(r["peak_rss_mib"], peer["peak_rss_mib"]), "≤ 1",
                 r["peak_rss_mib"] <= peer["peak_rss_mib"], shown, f"JobSet's CPU {peer['cpu_s']:.1f} s, ours {r['cpu_s']:.1f} s")
        # Leases aside: JobSet's controller runs here without leader election, ours with.
        beyond_lease = lambda counts: sum(n for k, n in counts.items()
                                          if not k.startswith("(") and not k.endswith(" leases")) / r["window_s"]
        ours, theirs = beyond_lease(r["settled_requests"]), beyond_lease(peer["settled_requests"])
        self.row("operator", f"{what}, settled: requests/s beyond the watches and the Lease, against JobSet's",
                 round(ours, 2), "JobSet", round(theirs, 2), ratio(ours, theirs), "≤ 1", ours <= theirs, shown,
                 f"JobSet's: {peer['settled_requests']}")
        self.row("operator", f"{what}: every fate shown, s", round(r["admission_s"], 1), "JobSet", round(peer["admission_s"], 1),
                 ratio(r["admission_s"], peer["admission_s"]), "—", None, shown,
                 f"etcd per run {r['etcd_bytes_per_run'] / 1e3:.1f} KB, per JobSet {peer['etcd_bytes_per_run'] / 1e3:.1f} KB")

    # Report -------------------------------------------------------------------------
    def report(self):
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        head = (f"Machine: {cpu}, {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}"
                f" GiB, {platform.platform()}; {self.threads} threads on both sides. "
                f"Date: {datetime.date.today().isoformat()}. Size: {'smoke' if self.a.smoke else 'full'}.")
        lines = [head, "", "| row | measurement | ours | peer | peer's | ratio | goal | met | load |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['row']} | {r['what']} | {r['ours']} | {r['peer']} | {r['peer_value']} | "
                         f"{r['ratio']} | {r['goal']} | {'–' if r['met'] is None else 'yes' if r['met'] else '**no**'} | {r['load']} |")
        lines.append("")
        for r in self.rows:
            note = f" ({r['note']})" if r["note"] else ""
            lines.append(f"- {r['row']}, {r['what']}{note}: `{r['command']}`")
        print("\n".join(lines))
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump({"header": head, "rows": self.rows, "failures": self.failures}, f, indent=1)


def largest(fits, start=1, ceiling=256):
    """The largest n in [start, ceiling] with fits(n), by doubling then bisection
    (fits is monotone: what fits at n fits below). Returns (n, the command of n's run)."""
    ok, cmd = fits(start)
    if not ok:
        return 0, cmd
    lo, lo_cmd, hi = start, cmd, None
    while hi is None:
        n = lo * 2
        if n > ceiling:
            return lo, lo_cmd
        ok, cmd = fits(n)
        if ok:
            lo, lo_cmd = n, cmd
        else:
            hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, cmd = fits(mid)
        if ok:
            lo, lo_cmd = mid, cmd
        else:
            hi = mid
    return lo, lo_cmd


def write_corpus(path, mb):
    """Every /usr/share/doc/*/copyright file (real licence and copyright prose, one
    document each), repeated to `mb` megabytes of jsonl."""
    docs = [open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob("/usr/share/doc/*/copyright"))]
    if not docs:
        raise RuntimeError("no /usr/share/doc/*/copyright files to make a corpus of")
    written = 0
    with open(path, "w") as f:
        while written < mb * 1e6:
            for d in docs:
                line = json.dumps({"text": d})
                f.write(line + "\n")
                written += len(line) + 1


ROWS = ("step", "memory", "generate", "checkpoint", "prepare", "loader", "operator")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="the suite")
    run.add_argument("--trainer", required=True)
    run.add_argument("--hostmem", required=True, help="trainer/csrc/memory.cpp built against this torch")
    run.add_argument("--operator-bench", required=True, help="shell command of the operator's benchmark")
    run.add_argument("--smoke", action="store_true")
    run.add_argument("--only", default=",".join(ROWS))
    run.add_argument("--threads", type=int, default=os.cpu_count())
    run.add_argument("--work", default=None, help="scratch directory [default: the system's]")
    run.add_argument("--disk", default=None, help="where checkpoints are written [default: --work]")
    run.add_argument("--json", default=None, help="also write the rows as JSON here")

    def peer_args(p, *extra):
        p.add_argument("--threads", type=int, required=True)
        for e in extra:
            e(p)

    shape = lambda p: (p.add_argument("--preset", required=True), p.add_argument("--micro-batch", type=int, default=1),
                       p.add_argument("--seq", type=int, required=True))
    s = sub.add_parser("peer-step")
    peer_args(s, shape)
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--compile", action="store_true")
    s.add_argument("--host-memory", default=None)
    s.add_argument("--limit-bytes", type=int, default=0)
    g = sub.add_parser("peer-generate")
    peer_args(g)
    g.add_argument("--dir", required=True)
    g.add_argument("--repeats", type=int, default=3)
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    g.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    c = sub.add_parser("peer-save")
    peer_args(c, shape)
    c.add_argument("--dir", required=True)
    c.add_argument("--repeats", type=int, default=3)
    t = sub.add_parser("peer-tokenize")
    peer_args(t)
    t.add_argument("--input", required=True)
    t.add_argument("--tokenizer", required=True)
    a = ap.parse_args()

    if a.cmd != "run":
        {"peer-step": peer_step, "peer-generate": peer_generate, "peer-save": peer_save,
         "peer-tokenize": peer_tokenize}[a.cmd](a)
        return
    only = [r for r in a.only.split(",") if r]
    unknown = sorted(set(only) - set(ROWS))
    if unknown:
        ap.error(f"--only {','.join(unknown)}: not a row; the rows are {','.join(ROWS)}")
    a.disk = a.disk or a.work or tempfile.gettempdir()
    suite = Suite(a)
    print(f"bench suite ({'smoke' if a.smoke else 'full'}), load average {os.getloadavg()[0]:.2f} at the start",
          file=sys.stderr, flush=True)
    suite.check_presets()
    for name in only:
        try:
            getattr(suite, name)()
        except Exception as e:  # one row's failure is reported; the others still run
            suite.check(False, f"{name}: {e}")
    suite.report()
    shutil.rmtree(suite.work, ignore_errors=True)
    if suite.failures:
        print("\n".join(["", "bench suite failures:"] + [f"- {f}" for f in suite.failures]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
