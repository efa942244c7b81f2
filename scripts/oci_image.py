#!/usr/bin/env python3
"""Container images without a Docker engine: deterministic layer tars and docker-archive
tarballs (what `docker save` writes, and `ctr -n k8s.io images import` reads).

  oci_image.py layer --root DIR [--include PATH]... [--empty PATH]... [--owner UID:GID]
                     [--xattr PATH NAME HEX]... OUT
      One layer: DIR's tree (or only the --include paths, absolute in the image, with their
      parent directories; --empty directories without their contents), sorted, mtime 0,
      numeric owners from the file system (or --owner for every entry), modes as they are,
      hard links within the layer as tar hard links, the file capability xattr
      (security.capability) kept. Streams to OUT, hashing as it writes; OUT.json gets
      {"diff_id", "size"}. Prints the diff_id.
  oci_image.py image --ref REF --config JSON OUT LAYER...
      A docker-archive of those layers (each with its OUT.json) and the image config
      ({"config": {...}, "history": [...]}: Entrypoint, Env, User...), tagged REF, where
      {id12} stands for the config digest's first 12 hex digits. Prints the config's digest
      (the image ID) and the ref.
  oci_image.py verify ARCHIVE
      Re-reads an archive: the config's name is its digest and rootfs.diff_ids are the
      sha256 of its layer tars. Prints the config digest.
Standard library only."""
import argparse
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile

EPOCH = "1970-01-01T00:00:00Z"
BUF = 1 << 20
CAP = "security.capability"


class HashWriter:
    """A write-only file that hashes what goes through it."""

    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b):
        self.h.update(b)
        self.f.write(b)
        self.n += len(b)
        return len(b)

    def tell(self):
        return self.n


def walk(root, rel, empty):
    """rel and, for a directory, everything under it: parents first, names sorted by bytes."""
    yield rel
    path = os.path.join(root, rel) if rel else root
    if os.path.isdir(path) and not os.path.islink(path) and rel not in empty:
        for name in sorted(os.listdir(path), key=os.fsencode):
            yield from walk(root, f"{rel}/{name}" if rel else name, empty)


def entries(root, includes, empty):
    empty = {p.strip("/") for p in empty or []}
    if not includes:
        for rel in walk(root, "", empty):
            if rel:
                yield rel
        return
    rels = sorted((p.strip("/") for p in includes), key=os.fsencode)
    for a, b in zip(rels, rels[1:]):
        if b.startswith(a + "/") or a == b:
            sys.exit(f"oci_image.py: --include {a} and {b} overlap")
    done = set()
    for rel in rels:
        parts = rel.split("/")
        for k in range(1, len(parts)):
            parent = "/".join(parts[:k])
            if parent not in done:
                done.add(parent)
                yield parent
        if not os.path.lexists(os.path.join(root, rel)):
            sys.exit(f"oci_image.py: {root} has no {rel}")
        yield from walk(root, rel, empty)


def layer(args):
    owner = tuple(int(x) for x in args.owner.split(":")) if args.owner else None
    xattrs = {}
    for path, name, value in args.xattr or []:
        xattrs.setdefault(path.strip("/"), {})[name] = bytes.fromhex(value)
    links, tmp = {}, args.out + ".tmp"
    with open(tmp, "wb", buffering=BUF) as f:
        w = HashWriter(f)
        with tarfile.open(fileobj=w, mode="w", format=tarfile.PAX_FORMAT, copybufsize=BUF) as t:
            for rel in entries(args.root, args.include, args.empty):
                path = os.path.join(args.root, rel)
                st = os.lstat(path)
                ti = tarfile.TarInfo(rel)
                ti.mtime, ti.mode, ti.uname, ti.gname = 0, stat.S_IMODE(st.st_mode), "", ""
                ti.uid, ti.gid = owner or (st.st_uid, st.st_gid)
                m, data = st.st_mode, None
                if stat.S_ISDIR(m):
                    ti.type = tarfile.DIRTYPE
                elif stat.S_ISLNK(m):
                    ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
                elif stat.S_ISREG(m):
                    key = (st.st_dev, st.st_ino)
                    if st.st_nlink > 1 and key in links:
                        ti.type, ti.linkname = tarfile.LNKTYPE, links[key]
                    else:
                        links[key] = rel
                        ti.type, ti.size, data = tarfile.REGTYPE, st.st_size, path
                        xa = dict(xattrs.get(rel, {}))
                        if CAP not in xa:
                            try:
                                xa[CAP] = os.getxattr(path, CAP, follow_symlinks=False)
                            except OSError:
                                pass
                        ti.pax_headers = {f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape")
                                          for k, v in sorted(xa.items())}
                elif stat.S_ISCHR(m) or stat.S_ISBLK(m):
                    ti.type = tarfile.CHRTYPE if stat.S_ISCHR(m) else tarfile.BLKTYPE
                    ti.devmajor, ti.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
                elif stat.S_ISFIFO(m):
                    ti.type = tarfile.FIFOTYPE
                else:
                    print(f"oci_image.py: skipping {path} (a socket)", file=sys.stderr)
                    continue
                if data is None:
                    t.addfile(ti)
                else:
                    with open(data, "rb") as src:
                        t.addfile(ti, src)
        f.flush()
        size, diff_id = w.n, "sha256:" + w.h.hexdigest()
    os.replace(tmp, args.out)
    with open(args.out + ".json.tmp", "w") as j:
        json.dump({"diff_id": diff_id, "size": size}, j)
    os.replace(args.out + ".json.tmp", args.out + ".json")
    print(diff_id)


def add_bytes(t, name, data):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
    t.addfile(ti, io.BytesIO(data))


def image(args):
    spec = json.load(open(args.config))
    metas = [json.load(open(p + ".json")) for p in args.layers]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    history = spec.get("history") or [{"created_by": f"layer {i}"} for i in range(len(metas))]
    config = {
        "architecture": arch,
        "os": "linux",
        "created": EPOCH,
        "config": spec["config"],
        "rootfs": {"type": "layers", "diff_ids": [m["diff_id"] for m in metas]},
        "history": [dict(h, created=EPOCH) for h in history],
    }
    cb = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    cd = hashlib.sha256(cb).hexdigest()
    names = [m["diff_id"].split(":")[1] + "/layer.tar" for m in metas]
    ref = args.ref.replace("{id12}", cd[:12])
    manifest = [{"Config": cd + ".json", "RepoTags": [ref], "Layers": names}]
    tmp = args.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT, copybufsize=BUF) as t:
        add_bytes(t, cd + ".json", cb)
        written = set()
        for path, meta, name in zip(args.layers, metas, names):
            if name in written:
                continue
            written.add(name)
            if os.path.getsize(path) != meta["size"]:
                sys.exit(f"oci_image.py: {path} is not the size its {path}.json says")
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = meta["size"], 0o644, 0
            with open(path, "rb") as src:
                t.addfile(ti, src)
        add_bytes(t, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
    os.replace(tmp, args.out)
    print(f"sha256:{cd} {ref}")


def verify(args):
    digests, manifest, configs = {}, None, {}
    with tarfile.open(args.archive, "r|") as t:
        for ti in t:
            if not ti.isfile():
                continue
            h, f = hashlib.sha256(), t.extractfile(ti)
            data = b""
            while chunk := f.read(BUF):
                h.update(chunk)
                if ti.name.endswith(".json"):
                    data += chunk
            digests[ti.name] = h.hexdigest()
            if ti.name == "manifest.json":
                manifest = json.loads(data)
            elif ti.name.endswith(".json"):
                configs[ti.name] = json.loads(data)
    if not manifest or len(manifest) != 1:
        sys.exit(f"{args.archive}: no manifest.json with one image")
    m = manifest[0]
    config = configs[m["Config"]]
    if digests[m["Config"]] != m["Config"].removesuffix(".json"):
        sys.exit(f"{args.archive}: the config's name is not its digest")
    want = ["sha256:" + digests[name] for name in m["Layers"]]
    if config["rootfs"]["diff_ids"] != want:
        sys.exit(f"{args.archive}: rootfs.diff_ids {config['rootfs']['diff_ids']} != the layers' {want}")
    print(f"sha256:{digests[m['Config']]} {m['RepoTags'][0]} {len(want)} layers")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("layer")
    lp.add_argument("--root", required=True)
    lp.add_argument("--include", action="append")
    lp.add_argument("--empty", action="append")
    lp.add_argument("--owner")
    lp.add_argument("--xattr", nargs=3, action="append", metavar=("PATH", "NAME", "HEX"))
    lp.add_argument("out")
    ip = sub.add_parser("image")
    ip.add_argument("--ref", required=True)
    ip.add_argument("--config", required=True)
    ip.add_argument("out")
    ip.add_argument("layers", nargs="+")
    vp = sub.add_parser("verify")
    vp.add_argument("archive")
    args = p.parse_args()
    {"layer": layer, "image": image, "verify": verify}[args.cmd](args)


if __name__ == "__main__":
    main()
