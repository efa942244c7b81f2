#!/usr/bin/env bash
# The container images a real-kubelet test cluster imports into its nodes' containerd
# (`ctr -n k8s.io images import ARCHIVE`), built without a Docker engine, and cached by
# content. Prints the directory that holds them:
#   <name>.tar    a docker-archive (manifest.json, the config, uncompressed layer tars)
#   images.json   {"<name>": {"ref": ..., "archive": "/abs/<name>.tar", "digest": "sha256:<config>"}}
#                 (the digest is the image ID, the config's digest; each ref's tag is
#                 e2e-<its first 12 hex digits>)
#
#   scripts/setup-images.sh --trainer PATH --operator PATH [--coredns PATH]
#
# The images:
#   pause     e2e/images/pause.c, built with gcc -static; ENTRYPOINT /pause, USER 65535:65535
#             (Kubernetes' pause image), puretransformer.local/pause.
#   trainer   trainer/Dockerfile's CPU image (ghcr.io/puretransformer/trainer): exactly the root
#             file system scripts/check-image.sh --variant cpu checks (scripts/image-rootfs.sh:
#             the runtime stage's Debian by debootstrap plus its RUN line; torch without include/
#             and share/ at the --trainer binary's RUNPATH; the binary at /usr/local/bin/trainer),
#             as three layers (the base, torch, the binary: the first two are cached under
#             $PT_CACHE/images/layers, so a new binary writes one layer), with the Dockerfile's
#             ENV, USER and ENTRYPOINT. /dev is empty, as in debian's image (the runtime mounts
#             its own; debootstrap made device nodes there).
#   operator  operator/Dockerfile's runtime stage (ghcr.io/puretransformer/operator): the
#             --operator binary (static: scripts/build-operator-static.sh; a dynamically linked
#             one is refused) at /operator on the equivalent of distroless/static:nonroot (which
#             no registry here serves): /etc/passwd and /etc/group with root, nobody and nonroot
#             (65532), /home/nonroot, /tmp (1777), the host's CA bundle at
#             /etc/ssl/certs/ca-certificates.crt; the Dockerfile's USER, EXPOSE, ENTRYPOINT.
#   coredns   with --coredns: the (static) binary at /coredns with cap_net_bind_service=+ep, on
#             the same base, USER 65532:65532, EXPOSE 53 53/udp, ENTRYPOINT /coredns, as
#             CoreDNS's own image; puretransformer.local/coredns.
#
# Cached under $PT_CACHE/images/<key>, the key hashing every input (the binaries, the
# Dockerfiles' runtime stages, the base's key, the torch files' names, sizes and times,
# the CA bundle, the compiler, this script, scripts/image-rootfs.sh and scripts/oci_image.py):
# a second run with the same inputs prints the directory at once, without root. The three
# newest keys are kept. Building needs root (debootstrap, chroot) and debootstrap
# (scripts/setup-debian.sh --image installs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/image-rootfs.sh
self="$PWD/scripts/setup-images.sh"
writer="$PWD/scripts/oci_image.py"
keep_keys=3

die() { echo "setup-images.sh: $*" >&2; exit 1; }
t0=$SECONDS
say() { echo "-- [$((SECONDS - t0))s] $*" >&2; }

trainer="" operator="" coredns=""
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$(realpath -e "$2")"; shift 2 ;;
    --operator) operator="$(realpath -e "$2")"; shift 2 ;;
    --coredns) coredns="$(realpath -e "$2")"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup-images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$trainer" ] || [ -z "$operator" ]; then
  echo "setup-images.sh: --trainer and --operator are required (see --help)" >&2
  exit 2
fi

# An image without a libc runs static executables only: a debug build links glibc.
static_or_die() {
  local what="$1" bin="$2"
  { [ -f "$bin" ] && [ -x "$bin" ]; } || die "--$what $bin is not an executable file"
  readelf -h "$bin" > /dev/null 2>&1 || die "--$what $bin is not an ELF executable"
  if readelf -lW "$bin" | grep -q 'Requesting program interpreter' || readelf -dW "$bin" | grep -q '(NEEDED)'; then
    die "--$what $bin is dynamically linked ($(file -b "$bin" | cut -d, -f1-4)); its image has no libc, so it needs a static binary$([ "$what" = operator ] && echo ": scripts/build-operator-static.sh builds one (operator/Dockerfile's build)")"
  fi
}
static_or_die operator "$operator"
[ -z "$coredns" ] || static_or_die coredns "$coredns"

# --- the inputs, and the key ------------------------------------------------------------------
trainer_stage
trainer_decl="$(declare -p IMG_FROM IMG_SUITE IMG_RUN IMG_ENV IMG_USER IMG_WORKDIR IMG_ENTRYPOINT IMG_CMD IMG_EXPOSE IMG_COPY)"
if [ ${#IMG_ENTRYPOINT[@]} -eq 0 ] || [ ${#IMG_CMD[@]} -gt 0 ]; then
  die "trainer/Dockerfile's runtime stage has no ENTRYPOINT, or a CMD: update this script"
fi
[ ${#IMG_OTHER[@]} -eq 0 ] || die "trainer/Dockerfile's runtime stage has what this script does not build: ${IMG_OTHER[*]}"
image_base_key
trainer_site "$trainer" cpu
image_stage operator/Dockerfile
operator_decl="$(declare -p IMG_FROM IMG_RUN IMG_ENV IMG_USER IMG_WORKDIR IMG_ENTRYPOINT IMG_CMD IMG_EXPOSE IMG_COPY)"
# The runtime stage this builds: distroless/static:nonroot plus the binary, nothing else.
[[ "$IMG_FROM" =~ ^gcr\.io/distroless/static(-debian[0-9]+)?:nonroot$ ]] \
  || die "operator/Dockerfile's runtime stage is FROM $IMG_FROM; this script builds distroless/static:nonroot's equivalent"
{ [ "${IMG_COPY[*]}" = "--from=build /operator /operator" ] && [ -z "$IMG_RUN" ] && [ ${#IMG_ENV[@]} -eq 0 ] \
  && [ -z "$IMG_WORKDIR" ] && [ ${#IMG_CMD[@]} -eq 0 ] && [ ${#IMG_OTHER[@]} -eq 0 ]; } \
  || die "operator/Dockerfile's runtime stage does more than COPY --from=build /operator /operator, USER, EXPOSE, ENTRYPOINT: update this script"
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || die "no CA bundle at $ca (Debian's ca-certificates)"
sum() { sha256sum "$1" | cut -c1-64; }
# The torch files' names, sizes, times and modes (hashing 1.2 GB on every run would not be "at once").
torch_dirs=("$IMG_SITE/torch")
[ -d "$IMG_SITE/nvidia" ] && torch_dirs+=("$IMG_SITE/nvidia")
torch_files="$(find "${torch_dirs[@]}" -printf '%p %y %s %T@ %m %U:%G\n' | LC_ALL=C sort | sha256sum | cut -c1-64)"
images="$PT_CACHE/images"
key="$(printf '%s\n' images-1 "$(uname -m)" \
  "trainer $(sum "$trainer")" "operator $(sum "$operator")" "coredns ${coredns:+$(sum "$coredns")}" \
  "$trainer_decl" "$operator_decl" "base $IMG_BASE_KEY" "site $IMG_SITE $torch_files" "ca $(sum "$ca")" \
  "$(gcc --version | head -n 1)" "$(ldd --version | head -n 1)" \
  "$(cat "$self" scripts/image-rootfs.sh "$writer" e2e/images/pause.c | sha256sum)" \
  | sha256sum | cut -c1-16)"
out="$images/$key"
if [ -f "$out/images.json" ]; then
  touch "$out"
  say "images: $out (cached)"
  echo "$out"
  exit 0
fi

# --- building ---------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || { echo "setup-images.sh: building the images needs root (debootstrap, chroot)" >&2; exit 2; }
scripts/setup-debian.sh --image
mkdir -p "$images/layers"
exec 8> "$images/lock"
flock 8
if [ -f "$out/images.json" ]; then  # built by the run this one waited for
  touch "$out"
  echo "$out"
  exit 0
fi
find "$images" -maxdepth 1 -name 'work.*' -mmin +360 -exec rm -rf --one-file-system {} +
work="$(mktemp -d "$images/work.XXXXXX")"
trap 'rm -rf --one-file-system "$work"' EXIT
trap 'exit 130' INT TERM
stage="$work/out"
mkdir "$stage"
used=()  # the cached layers this key uses

# layer NAME CACHE-KEY WRITER-ARGS...: NAME.tar in the layer cache when CACHE-KEY is given
# (written once), else in the work directory. Sets LAYER to its path.
layer() {
  local name="$1" ckey="$2"
  shift 2
  if [ -n "$ckey" ]; then
    LAYER="$images/layers/$name-$ckey.tar"
    used+=("${LAYER##*/}")
    if [ -f "$LAYER.json" ]; then
      say "layer $name: cached ($(du -h --apparent-size "$LAYER" | cut -f1))"
      return
    fi
  else
    LAYER="$work/$name.tar"
  fi
  python3 "$writer" layer "$@" "$LAYER" > /dev/null
  say "layer $name: $(du -h --apparent-size "$LAYER" | cut -f1), $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["diff_id"][:19])' "$LAYER.json")"
}

# config FILE USER WORKDIR ENV... -- ENTRYPOINT... -- EXPOSE... -- HISTORY...: the image's
# config (what `docker inspect` calls Config) and the layers' history.
config() {
  python3 - "$@" <<'PY'
import json, sys
out, user, workdir, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
groups, cur = [], []
for a in rest:
    if a == "--":
        groups.append(cur)
        cur = []
    else:
        cur.append(a)
groups.append(cur)
env, entry, expose, history = groups
c = {"User": user, "Env": env, "Entrypoint": entry}
if workdir:
    c["WorkingDir"] = workdir
if expose:
    c["ExposedPorts"] = {(p if "/" in p else p + "/tcp"): {} for p in expose}
json.dump({"config": c, "history": [{"created_by": h} for h in history]}, open(out, "w"))
PY
}

# image NAME REPO CONFIG LAYER...: NAME.tar, tagged REPO:e2e-<the config digest's first 12>.
declare -A refs digests
image() {
  local name="$1" repo="$2" cfg="$3" res digest ref
  shift 3
  res="$(python3 "$writer" image --ref "$repo:e2e-{id12}" --config "$cfg" "$stage/$name.tar" "$@")"
  digest="${res%% *}" ref="${res#* }"
  refs[$name]="$ref" digests[$name]="$digest"
  say "image $name: $ref ($(du -h --apparent-size "$stage/$name.tar" | cut -f1), $digest)"
}

path_env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# --- pause ------------------------------------------------------------------------------------
mkdir "$work/pause"
gcc -static -O2 -s -Wall -o "$work/pause/pause" e2e/images/pause.c
chmod 0755 "$work/pause/pause"
layer pause "" --root "$work/pause" --owner 0:0
config "$work/pause.json" 65535:65535 "" -- /pause -- -- "COPY pause /pause (e2e/images/pause.c, gcc -static -O2)"
image pause puretransformer.local/pause "$work/pause.json" "$LAYER"

# --- trainer: the Dockerfile's CPU image, the root file system check-image.sh checks -------------
eval "$trainer_decl"
image_base
# A base being rebuilt for another key is deleted: read this one under the base's lock.
exec 9> "$IMG_CACHE/lock"
flock -s 9
[ -f "$IMG_BASE.ok" ] || die "$IMG_BASE went away (rebuilt for another Dockerfile?): run again"
say "image root file system (scripts/image-rootfs.sh): $work/trainer-root"
trainer_rootfs "$work/trainer-root" "$trainer"
wkey="$(cat scripts/image-rootfs.sh "$writer" | sha256sum | cut -c1-16)"
# /dev: the runtime mounts its own (debian's image has it empty; debootstrap made nodes).
layer trainer-base "$IMG_BASE_KEY-$wkey" --root "$IMG_BASE" --empty /dev
base_layer="$LAYER"
# The torch layer: $IMG_SITE and its parent directories (opened a+rx), all root's as the
# builder stage's COPY makes them.
layer trainer-torch "$(printf '%s\n' "$IMG_BASE_KEY" "$IMG_SITE" "$torch_files" "$wkey" | sha256sum | cut -c1-16)" \
  --root "$work/trainer-root" --include "$IMG_SITE" --owner 0:0
torch_layer="$LAYER"
layer trainer-bin "" --root "$work/trainer-root" --include /usr/local/bin/trainer --owner 0:0
flock -u 9
config "$work/trainer.json" "$IMG_USER" "$IMG_WORKDIR" "$path_env" "${IMG_ENV[@]}" -- "${IMG_ENTRYPOINT[@]}" -- "${IMG_EXPOSE[@]}" -- \
  "debootstrap --variant=minbase $IMG_SUITE; RUN $IMG_RUN" \
  "COPY --from=build /runtime$IMG_SITE $IMG_SITE (torch without include/, share/)" \
  "COPY --from=build /usr/local/bin/trainer /usr/local/bin/trainer"
image trainer ghcr.io/puretransformer/trainer "$work/trainer.json" "$base_layer" "$torch_layer" "$LAYER"
rm -rf --one-file-system "$work/trainer-root"

# --- distroless/static:nonroot's equivalent, the operator's and CoreDNS's base --------------------
d="$work/distroless"
(
  umask 022
  mkdir -p "$d/etc/ssl/certs" "$d/home/nonroot" "$d/root" "$d/tmp"
  printf '%s\n' root:x:0:0:root:/root:/sbin/nologin nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin \
    nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin > "$d/etc/passwd"
  printf '%s\n' root:x:0: nobody:x:65534: tty:x:5: staff:x:50: nonroot:x:65532: > "$d/etc/group"
  echo 'hosts: files dns' > "$d/etc/nsswitch.conf"
  install -m 0644 "$ca" "$d/etc/ssl/certs/ca-certificates.crt"
  chmod 0700 "$d/root" "$d/home/nonroot"
  chmod 1777 "$d/tmp"
  chown -R 0:0 "$d"
  chown 65532:65532 "$d/home/nonroot"
)
layer distroless "" --root "$d"
distroless_layer="$LAYER"
distroless_history="distroless/static:nonroot's equivalent: /etc/passwd, /etc/group (root, nobody, nonroot 65532), /home/nonroot, /tmp, the CA bundle"
distroless_env=("$path_env" SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)

# --- operator ------------------------------------------------------------------------------------
eval "$operator_decl"
mkdir "$work/operator"
cp "$operator" "$work/operator/operator"
chmod 0755 "$work/operator/operator"
layer operator "" --root "$work/operator" --owner 0:0
# distroless' nonroot sets WORKDIR /home/nonroot; the Dockerfile keeps it.
config "$work/operator.json" "$IMG_USER" /home/nonroot "${distroless_env[@]}" -- "${IMG_ENTRYPOINT[@]}" -- "${IMG_EXPOSE[@]}" -- \
  "$distroless_history" "COPY --from=build /operator /operator"
image operator ghcr.io/puretransformer/operator "$work/operator.json" "$distroless_layer" "$LAYER"

# --- coredns ---------------------------------------------------------------------------------------
if [ -n "$coredns" ]; then
  mkdir "$work/coredns"
  cp "$coredns" "$work/coredns/coredns"
  chmod 0755 "$work/coredns/coredns"
  # setcap cap_net_bind_service=+ep (a v2 vfs_cap_data: effective, permitted bit 10), as
  # CoreDNS's image does so that 65532 binds port 53; set in the layer, not on this file.
  layer coredns "" --root "$work/coredns" --owner 0:0 \
    --xattr /coredns security.capability 0100000200040000000000000000000000000000
  config "$work/coredns.json" 65532:65532 / "${distroless_env[@]}" -- /coredns -- 53 53/udp -- \
    "$distroless_history" "COPY coredns /coredns (setcap cap_net_bind_service=+ep)"
  image coredns puretransformer.local/coredns "$work/coredns.json" "$distroless_layer" "$LAYER"
fi

# --- images.json, then the directory in place; older keys go ---------------------------------------
{
  for name in "${!refs[@]}"; do
    printf '%s\t%s\t%s\n' "$name" "${refs[$name]}" "${digests[$name]}"
  done
} | python3 -c '
import json, sys
out = sys.argv[1]
images = {}
for line in sys.stdin:
    name, ref, digest = line.rstrip("\n").split("\t")
    images[name] = {"ref": ref, "archive": f"{out}/{name}.tar", "digest": digest}
print(json.dumps(dict(sorted(images.items())), indent=2))
' "$out" > "$stage/images.json"
printf '%s\n' "${used[@]}" > "$stage/layers.txt"
rm -rf --one-file-system "$out"
mv "$stage" "$out"
keys() { find "$images" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' -printf '%T@ %p\n' | sort -rn | cut -d' ' -f2-; }
keys | tail -n +$((keep_keys + 1)) | while read -r old; do
  say "removing an older key's images: $old"
  rm -rf --one-file-system "$old"
done
keys | while read -r k; do cat "$k/layers.txt" 2>/dev/null || true; done | sort -u > "$work/kept"
for f in "$images"/layers/*.tar; do
  [ -e "$f" ] || continue
  grep -qxF "${f##*/}" "$work/kept" || { say "removing an unused layer: ${f##*/}"; rm -f "$f" "$f.json"; }
done
say "images: $out ($(du -sh "$out" | cut -f1))"
echo "$out"
