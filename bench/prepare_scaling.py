#!/usr/bin/env python3
"""How `trainer prepare` scales with the cores of one worker and with workers that each
have their own cores (pods on separate nodes, pinned here with CPU affinity), on the same
corpus and tokenizer; checks on the way that every worker count merges to the same
manifest as one worker. The paper model in docs/perf.md ("the seeds' sizes on paper")
assumes both scale linearly; this measures it where a machine has the cores.

  bench/prepare_scaling.py corpus --out DIR [--mb 128 --files 16]   # licence prose as jsonl
  bench/prepare_scaling.py run --trainer T --corpus DIR --tokenizer tokenizer.json \\
      [--cores 1,2,4,8,16] [--workers 1,2,4,8 --cores-per-worker 2] [--peer] --work W

Prints one JSON line a measurement, then a table. Core counts above the machine's are skipped.
"""
import argparse
import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def corpus(a):
    """Every /usr/share/doc/*/copyright file, one document each, repeated to `--mb`
    megabytes and dealt round-robin into `--files` jsonl files (bench/suite.py's corpus)."""
    docs = [open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob("/usr/share/doc/*/copyright"))]
    if not docs:
        sys.exit("no /usr/share/doc/*/copyright files to make a corpus of")
    os.makedirs(a.out, exist_ok=True)
    files = [open(os.path.join(a.out, f"part-{i:03}.jsonl"), "w") for i in range(a.files)]
    written, n = 0, 0
    while written < a.mb * 1e6:
        for d in docs:
            line = json.dumps({"text": d}) + "\n"
            files[n % a.files].write(line)
            written += len(line)
            n += 1
    for f in files:
        f.close()
    print(f"{a.out}: {n} documents, {written / 1e6:.1f} MB in {a.files} files")


def pinned(cores):
    return lambda: os.sched_setaffinity(0, cores)


def prepare(a, out, workers, cores_of):
    """`workers` processes of `--step work`, worker i pinned to cores_of[i], all at once;
    the wall time until the last one exits."""
    t0 = time.perf_counter()
    procs = []
    for i in range(workers):
        env = dict(os.environ, RAYON_NUM_THREADS=str(len(cores_of[i])))
        env.pop("TRAINER_STATUS_PORT", None)
        cmd = [a.trainer, "prepare", "-i", a.corpus, "--tokenizer", a.tokenizer, "-o", out,
               "--step", "work", "--workers", str(workers), "--worker", str(i)]
        procs.append(subprocess.Popen(cmd, env=env, preexec_fn=pinned(cores_of[i]),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            sys.exit(f"trainer prepare failed ({p.returncode}): {o}\n{e[-2000:]}")
    wall = time.perf_counter() - t0
    subprocess.run([a.trainer, "prepare", "-i", a.corpus, "--tokenizer", a.tokenizer, "-o", out,
                    "--step", "merge", "--name", "scaling"], check=True, capture_output=True)
    m = json.load(open(os.path.join(out, "manifest.json")))
    return wall, m


def tokens_of(m):
    return sum(e["tokens"] for split in ("train", "validation") for e in m[split])


def run(a):
    have = sorted(os.sched_getaffinity(0))
    rows, base_manifest = [], None
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(a.corpus, "*")))

    def record(kind, workers, cores, wall, m):
        nonlocal base_manifest
        out_manifest = os.path.join(a.work, "manifest-of-one.json")
        same = None
        if base_manifest is None:
            base_manifest = out_manifest
            json.dump(m, open(out_manifest, "w"), sort_keys=True)
        else:
            json.dump(m, open(out_manifest + ".this", "w"), sort_keys=True)
            same = filecmp.cmp(out_manifest, out_manifest + ".this", shallow=False)
        tok = tokens_of(m)
        r = {"kind": kind, "workers": workers, "cores": cores, "seconds": round(wall, 2),
             "mb_per_s": round(size / 1e6 / wall, 2), "tokens": tok, "tokens_per_s": round(tok / wall),
             "tokens_per_s_per_core": round(tok / wall / cores), "same_manifest_as_first": same}
        print(json.dumps(r), flush=True)
        rows.append(r)

    for c in [int(x) for x in a.cores.split(",") if x]:
        if c > len(have):
            print(f"skipped: {c} cores, the machine has {len(have)}", file=sys.stderr)
            continue
        out = os.path.join(a.work, f"cores-{c}")
        shutil.rmtree(out, ignore_errors=True)
        wall, m = prepare(a, out, 1, [set(have[:c])])
        record("one worker", 1, c, wall, m)
        shutil.rmtree(out)
    cpw = a.cores_per_worker
    for w in [int(x) for x in a.workers.split(",") if x]:
        if w * cpw > len(have):
            print(f"skipped: {w} workers of {cpw} cores, the machine has {len(have)}", file=sys.stderr)
            continue
        out = os.path.join(a.work, f"workers-{w}")
        shutil.rmtree(out, ignore_errors=True)
        wall, m = prepare(a, out, w, [set(have[i * cpw:(i + 1) * cpw]) for i in range(w)])
        record(f"workers of {cpw} cores", w, w * cpw, wall, m)
        shutil.rmtree(out)
    if a.peer:
        files = sorted(glob.glob(os.path.join(a.corpus, "*.jsonl")))
        joined = os.path.join(a.work, "all.jsonl")
        with open(joined, "wb") as f:
            for p in files:
                f.write(open(p, "rb").read())
        p = subprocess.run([sys.executable, os.path.join(HERE, "suite.py"), "peer-tokenize", "--input", joined,
                            "--tokenizer", a.tokenizer, "--threads", str(len(have))], check=True, capture_output=True, text=True)
        peer = json.loads(p.stdout.strip().splitlines()[-1])
        print(json.dumps({"kind": "HF tokenizers encode_batch", "cores": len(have), **peer}), flush=True)
    print(f"\n{size / 1e6:.1f} MB in {len(glob.glob(os.path.join(a.corpus, '*')))} files")
    print("| run | cores | s | MB/s | M tokens/s | M tokens/s a core | speed-up | same manifest |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    first = rows[0] if rows else None
    for r in rows:
        print(f"| {r['workers']} × {r['kind']} | {r['cores']} | {r['seconds']} | {r['mb_per_s']} | "
              f"{r['tokens_per_s'] / 1e6:.2f} | {r['tokens_per_s_per_core'] / 1e6:.2f} | "
              f"{first['seconds'] / r['seconds']:.2f}× | {r['same_manifest_as_first']} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", required=True)
    c.add_argument("--mb", type=float, default=128)
    c.add_argument("--files", type=int, default=16)
    r = sub.add_parser("run")
    r.add_argument("--trainer", required=True)
    r.add_argument("--corpus", required=True)
    r.add_argument("--tokenizer", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--cores", default="1,2,4,8,16")
    r.add_argument("--workers", default="1,2,4,8")
    r.add_argument("--cores-per-worker", type=int, default=2)
    r.add_argument("--peer", action="store_true", help="also HF tokenizers' encode_batch on all cores")
    a = ap.parse_args()
    if a.cmd == "corpus":
        corpus(a)
    else:
        os.makedirs(a.work, exist_ok=True)
        run(a)


if __name__ == "__main__":
    main()
