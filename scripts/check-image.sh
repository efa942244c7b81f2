#!/usr/bin/env bash
# The trainer image, checked without a Docker engine: the image is only files, so this
# builds trainer/Dockerfile's runtime stage as a root file system (debootstrap's
# minbase of the stage's Debian release, then the stage's own RUN line in a chroot),
# copies in what the build stage copies (the venv's torch without include/ and share/,
# nvidia/ when present, the binary at /usr/local/bin/trainer), and runs it the way a
# container runtime would (private mount, PID, network and UTS namespaces; a minimal
# /dev, /proc, read-only /sys; the image's USER, its ENV; no new privileges):
#   ldd     the binary's libraries all resolve inside the image, with nothing on the
#           library path (for the CUDA image also the libraries libtorch loads by
#           itself on a GPU: its own, cuDNN's and NVRTC's); only the driver's
#           libcuda.so.1 may be missing;
#   info    `trainer info` as the image's USER;
#   launch  the Job `operator render` makes for examples/tiny-cluster.yaml (with a
#           smaller token budget): its command, environment, security context and
#           volumes (the ConfigMap's run.json read-only at its path, the checkpoint
#           claim, emptyDirs), the root file system read-only. It must exit 0 and leave
#           the last step's checkpoint on the claim, owned by the Job's user.
#
#   scripts/check-image.sh                     # the CUDA image (the Dockerfile's default)
#   scripts/check-image.sh --variant cpu       # the CPU image kind uses (relinks the trainer
#                                              # against the CPU libtorch: minutes)
#   scripts/check-image.sh --cpu-only          # the same, saying loudly the CUDA image is skipped
#   scripts/check-image.sh --binary PATH       # check this trainer instead of building one
#                                              # (its variant is the one it was built for)
#   scripts/check-image.sh --remove-lib libgomp.so.1   # delete every copy of a library from
#                                              # the image first (or one file: an absolute
#                                              # path); the checks must then fail
#   scripts/check-image.sh --keep              # keep the root file system, print its path
#
# The image's root file system is built by scripts/image-rootfs.sh (which
# scripts/setup-images.sh also builds the test cluster's trainer image from). Its base is
# cached under $PT_CACHE/image-check, keyed by the stage's FROM and RUN lines and the
# mirror (DEBIAN_MIRROR), so a warm run downloads nothing.
# Needs root (debootstrap, chroot, mounts, namespaces) and debootstrap
# (scripts/setup-debian.sh --image installs it).
set -euo pipefail

# --- the container: run as `unshare ... check-image.sh __sandbox SPEC` ------------------
# SPEC sets SBX_ROOT, SBX_USER (uid:gid), SBX_GROUPS, SBX_HOSTNAME, SBX_RO, SBX_ENV,
# SBX_FILES ("host|container" files the runtime provides), SBX_MOUNTS
# ("bind|host|container|ro|rw" or "tmpfs|options|container") and SBX_CMD.
sandbox() {
  # shellcheck disable=SC1090
  . "$1"
  local r="$SBX_ROOT" m kind a dst mode n
  local setpriv chroot
  setpriv="$(command -v setpriv)" chroot="$(command -v chroot)"
  # A mount of its own, to be made read-only once everything is mounted on it.
  mount --bind "$r" "$r"
  mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
  # Docker's /dev: a tmpfs with the harmless devices, the fd links and a 64M /dev/shm.
  mount -t tmpfs -o nosuid,mode=755,size=65536k tmpfs "$r/dev"
  for n in null zero full random urandom tty; do
    : > "$r/dev/$n"
    mount --bind "/dev/$n" "$r/dev/$n"
  done
  ln -s /proc/self/fd "$r/dev/fd"
  ln -s /proc/self/fd/0 "$r/dev/stdin"
  ln -s /proc/self/fd/1 "$r/dev/stdout"
  ln -s /proc/self/fd/2 "$r/dev/stderr"
  mkdir "$r/dev/shm" "$r/dev/pts"
  mount -t tmpfs -o nosuid,nodev,noexec,mode=1777,size=65536k shm "$r/dev/shm"
  # Files the runtime bind-mounts: /etc/hosts, /etc/hostname, /etc/resolv.conf and
  # Kubernetes' /dev/termination-log. Mount points are created (never written into:
  # the root file system's files are hard links to the cache).
  for m in "${SBX_FILES[@]}"; do
    a="${m%%|*}" dst="$r${m#*|}"
    [ -e "$dst" ] || : > "$dst"
    mount --bind "$a" "$dst"
  done
  for m in "${SBX_MOUNTS[@]}"; do
    IFS='|' read -r kind a dst mode <<< "$m"
    mkdir -p "$r$dst"
    case "$kind" in
      bind)
        mount --bind "$a" "$r$dst"
        [ "$mode" = ro ] && mount -o remount,bind,ro "$r$dst" ;;
      tmpfs) mount -t tmpfs -o "$a" tmpfs "$r$dst" ;;
    esac
  done
  [ "$SBX_RO" = 1 ] && mount -o remount,bind,ro "$r"
  ip link set lo up
  hostname "$SBX_HOSTNAME"
  # chroot changes to / (the image's WORKDIR) and drops root for SBX_USER; after that
  # setuid the process has no capabilities, and no_new_privs is allowPrivilegeEscalation: false.
  exec env -i "${SBX_ENV[@]}" "$setpriv" --no-new-privs \
    "$chroot" --userspec="$SBX_USER" ${SBX_GROUPS:+--groups="$SBX_GROUPS"} "$r" "${SBX_CMD[@]}"
}
if [ "${1:-}" = __sandbox ]; then
  sandbox "$2"
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/image-rootfs.sh
self="$PWD/scripts/check-image.sh"

variant="" binary="" keep=0
remove=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant="$2"; shift 2 ;;
    --cpu-only) variant=cpu; shift
      echo "######## --cpu-only: SKIPPING the CUDA image (trainer/Dockerfile's default) ########" >&2 ;;
    --binary) binary="$(realpath "$2")"; shift 2 ;;
    --remove-lib) remove+=("$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$variant" in cpu|cuda|"") ;; *) echo "check-image.sh: --variant is cpu or cuda" >&2; exit 2 ;; esac
# A --binary alone says its variant (whether it links libtorch_cuda); else the CUDA image.
if [ -z "$variant" ] && [ -n "$binary" ]; then
  if readelf -d "$binary" | grep -q 'NEEDED.*libtorch_cuda.so'; then variant=cuda; else variant=cpu; fi
fi
variant="${variant:-cuda}"
if [ "$(id -u)" -ne 0 ]; then
  echo "check-image.sh: needs root (debootstrap, chroot, mounts, namespaces)" >&2
  exit 2
fi
scripts/setup-debian.sh --image

t0=$SECONDS
say() { echo "-- [$((SECONDS - t0))s] $*" >&2; }
results=()
failed=0
pass() { results+=("PASS  $1"); say "PASS $1"; }
fail() { results+=("FAIL  $1"); failed=1; say "FAIL $1"; }
summary() {
  echo
  echo "== check-image ($variant image, ${SECONDS}s):"
  printf '  %s\n' "${results[@]}"
  if [ "$failed" -ne 0 ]; then
    echo "== check-image: FAILED (${remove[*]:+with ${remove[*]} removed from the image; }logs above)"
  else
    echo "== check-image: the $variant image runs"
  fi
}

cache="$IMG_CACHE"
mkdir -p "$cache"
# Leftovers of runs that were killed (their mounts ended with their namespaces).
find "$cache" -maxdepth 1 -name 'work.*' -mmin +360 -exec rm -rf --one-file-system {} +
work="$(mktemp -d "$cache/work.XXXXXX")"
cleanup() {
  local m
  # The mounts live in the sandboxes' private namespaces and end with them; unmount
  # anything that leaked anyway before deleting, and never cross into a mount.
  for m in $(findmnt -rn -o TARGET | grep -F "$work/" | sort -r); do umount -l "$m" || true; done
  if [ "$keep" = 1 ]; then
    echo "kept: $work" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

py="$PT_VENV_CPU/bin/python"
[ -x "$py" ] && "$py" -c 'import yaml' 2>/dev/null || py=python3
helper() { "$py" - "$@" <<'PY'
import json, os, re, shlex, sys
import yaml

def q(v):
    return shlex.quote(str(v))

def arr(name, items):
    print(f"{name}=({' '.join(q(i) for i in items)})")

def derive(src, dst, tokens):
    run = yaml.safe_load(open(src))
    run["spec"]["tokens"] = tokens
    yaml.safe_dump(run, open(dst, "w"), sort_keys=False)

def render(path, work, index):
    """The pod of the rendered Job's index-th completion, as shell assignments; its
    ConfigMap and claims become directories under work."""
    index = int(index)
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    if len(pod["containers"]) != 1 or pod.get("initContainers"):
        sys.exit("the Job's pod is not one container: check-image.sh runs one")
    c = pod["containers"][0]
    psc, csc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
    fs_group = psc.get("fsGroup")
    hostname = f"{job['metadata']['name']}-{index}"  # an Indexed Job's pod with a subdomain
    ns = job["metadata"].get("namespace", "default")
    env = [f"JOB_COMPLETION_INDEX={index}"]  # set by the Job controller on Indexed Jobs
    for e in c.get("env", []):
        if "value" in e:
            env.append(f"{e['name']}={e['value']}")
            continue
        field = (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.annotations['batch.kubernetes.io/job-completion-index']":
            env.append(f"{e['name']}={index}")
        elif field == "metadata.name":
            env.append(f"{e['name']}={hostname}")
        elif field == "metadata.namespace":
            env.append(f"{e['name']}={ns}")
        else:
            sys.exit(f"check-image.sh cannot fill env {e['name']}: {e.get('valueFrom')}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts, run, checkpoint = [], None, None
    for m in c.get("volumeMounts", []):
        v, path, ro = volumes[m["name"]], m["mountPath"], m.get("readOnly", False)
        if "persistentVolumeClaim" in v:
            pvc = v["persistentVolumeClaim"]
            host = os.path.join(work, "pvc", pvc["claimName"])
            os.makedirs(host, exist_ok=True)
            if fs_group is not None:  # what the kubelet does to a volume for fsGroup
                os.chown(host, 0, fs_group)
                os.chmod(host, 0o2775)
            ro = ro or pvc.get("readOnly", False)
            mounts.append(f"bind|{host}|{path}|{'ro' if ro else 'rw'}")
            if not ro and checkpoint is None:
                checkpoint = (host, path)
        elif "configMap" in v:
            cm = cms[v["configMap"]["name"]]
            host = os.path.join(work, "configmap", cm["metadata"]["name"])
            os.makedirs(host, exist_ok=True)
            items = v["configMap"].get("items") or [{"key": k, "path": k} for k in cm["data"]]
            for it in items:
                f = os.path.join(host, it["path"])
                open(f, "w").write(cm["data"][it["key"]])
                os.chmod(f, 0o644)
                if it["key"] == "run.json":
                    run = json.loads(cm["data"][it["key"]])
            mounts.append(f"bind|{host}|{path}|ro")  # ConfigMap volumes are read-only
        elif "emptyDir" in v:
            opts = "nosuid,nodev,mode=0777"
            if fs_group is not None:
                opts = f"nosuid,nodev,mode=2777,gid={fs_group}"
            mounts.append(f"tmpfs|{opts}|{path}")
        else:
            sys.exit(f"check-image.sh cannot provide volume {m['name']}: {sorted(v)}")
    if run is None or checkpoint is None:
        sys.exit("the rendered Job mounts no run.json or no writable claim")
    print(f"JOB_UID={q(uid)}")
    print(f"JOB_GID={q(gid)}")
    print(f"JOB_FSGROUP={q(fs_group if fs_group is not None else '')}")
    print(f"JOB_RO={1 if csc.get('readOnlyRootFilesystem') else 0}")
    print(f"JOB_HOSTNAME={q(hostname)}")
    fqdn = f"{hostname}.{pod.get('subdomain', '')}.{ns}.svc.cluster.local"
    print(f"JOB_FQDN={q(fqdn)}")
    print(f"JOB_NS={q(ns)}")
    arr("JOB_ENV", env)
    arr("JOB_MOUNTS", mounts)
    arr("JOB_CMD", (c.get("command") or []) + (c.get("args") or []))
    print(f"JOB_CKPT_HOST={q(checkpoint[0])}")
    print(f"JOB_CKPT_PATH={q(checkpoint[1])}")
    print(f"RUN_STEPS={q(run['schedule']['totalSteps'])}")

def info(path, variant):
    """Checks `trainer info`'s JSON."""
    out = open(path).read()
    doc = json.loads(out[out.index("{"):])
    devices = [d["device"] for d in doc["devices"]]
    if "Cpu" not in devices:
        sys.exit(f"no CPU device: {devices}")
    if doc["cudaFeature"] != (variant == "cuda"):
        sys.exit(f"cudaFeature is {doc['cudaFeature']} in the {variant} image")
    print(f"devices {devices}, cudaFeature {doc['cudaFeature']}, {doc['threads']} threads")

globals()[sys.argv[1]](*sys.argv[2:])
PY
}

# --- the runtime stage, read from the Dockerfile -----------------------------------------
trainer_stage

# --- the base root file system: debootstrap, then the stage's RUN line -----------------
image_base

# --- the image: the base plus what the build stage copies ------------------------------
if [ -z "$binary" ]; then
  say "the $variant trainer"
  if [ "$variant" = cuda ]; then
    binary="$(scripts/build-cuda.sh)"
  else
    # One target directory for both builds: this relinks the trainer against the CPU
    # libtorch (and the next --features cuda build relinks it back).
    LIBTORCH="$(scripts/setup-libtorch.sh cpu)" cargo build -q --workspace --bin trainer --test libtorch --locked >&2
    binary="$CARGO_TARGET_DIR/debug/trainer"
  fi
fi
trainer_site "$binary" "$variant"
site="$IMG_SITE"

root="$work/root"
say "image root file system: $root"
umask 022
trainer_rootfs "$root" "$binary"
say "image: $(du -sh --apparent-size "$root" | cut -f1) (torch $(du -sh --apparent-size "$root$site/torch" | cut -f1)$([ -d "$root$site/nvidia" ] && echo ", nvidia $(du -sh --apparent-size "$root$site/nvidia" | cut -f1)"))"

# A name removes every copy in the image; a path (/usr/lib/...) that one file.
for lib in "${remove[@]}"; do
  if [[ "$lib" == /* ]]; then
    gone="$( { [ -e "$root$lib" ] || [ -L "$root$lib" ]; } && rm -f "$root$lib" && echo "$lib" || true)"
  else
    gone="$(find "$root" -xdev -name "$lib" \( -type f -o -type l \) -print -delete | sed "s|^$root||")"
  fi
  if [ -z "$gone" ]; then
    echo "check-image.sh: --remove-lib $lib: the image has no $lib" >&2
    exit 2
  fi
  say "removed from the image (--remove-lib $lib): $(echo $gone)"
done

# --- running it -----------------------------------------------------------------------
# Files a container runtime provides.
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$work/hosts"
echo 'search svc.cluster.local cluster.local' > "$work/resolv.conf"
: > "$work/termination-log"
chmod 0666 "$work/termination-log"
img_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
home_of() { awk -F: -v u="$1" '$3 == u { print $6; found = 1 } END { if (!found) print "/" }' "$root/etc/passwd"; }

# run NAME TIMEOUT SPEC-LINES... -- writes the spec and runs the sandbox; output in $work/NAME.log
run() {
  local name="$1" limit="$2" spec="$work/$1.spec"
  shift 2
  printf '%s\n' "$@" > "$spec"
  timeout -k 10 "$limit" unshare --mount --uts --ipc --net --pid --fork --kill-child --propagation private -- \
    "$self" __sandbox "$spec" > "$work/$name.log" 2>&1
}
spec_line() { local n="$1"; shift; printf '%s=(' "$n"; printf '%q ' "$@"; printf ')'; }
# why LOG: the loader's complaint in a log, else its last line.
why() {
  grep -m1 -o 'error while loading shared libraries: [^:]*' "$1" \
    || grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c1-200
}

img_uid="${IMG_USER%%:*}"
echo "check-image" > "$work/hostname.image"
image_spec=(
  "SBX_ROOT=$(printf %q "$root")" "SBX_USER=$IMG_USER" "SBX_GROUPS=" "SBX_HOSTNAME=check-image" "SBX_RO=1"
  "$(spec_line SBX_ENV "$img_path" HOSTNAME=check-image "HOME=$(home_of "$img_uid")" "${IMG_ENV[@]}")"
  "$(spec_line SBX_FILES "$work/hosts|/etc/hosts" "$work/hostname.image|/etc/hostname" "$work/resolv.conf|/etc/resolv.conf")"
  # docker run --read-only --tmpfs /tmp
  "$(spec_line SBX_MOUNTS "tmpfs|nosuid,nodev,mode=1777|/tmp")"
)

# ldd: the binary, and on CUDA the libraries libtorch opens itself: its own (NVRTC's
# wrapper for the jiterator, linalg), cuDNN's engines and NVRTC.
libs=(/usr/local/bin/trainer)
if [ "$variant" = cuda ]; then
  while IFS= read -r f; do libs+=("${f#"$root"}"); done < <(
    find "$root$site/torch/lib" -maxdepth 1 -name '*.so' -type f
    find "$root$site/nvidia/cudnn/lib" -name '*.so*' -type f
    find "$root$site/nvidia/cu13/lib" -name 'libnvrtc*.so*' -type f)
fi
what="the binary$([ ${#libs[@]} -gt 1 ] && echo " and $((${#libs[@]} - 1)) libraries libtorch opens itself" || true)"
say "ldd in the image, as $IMG_USER: $what"
if run ldd 60 "${image_spec[@]}" "$(spec_line SBX_CMD ldd "${libs[@]}")"; then ldd_rc=0; else ldd_rc=$?; fi
# libcuda.so.1 is the driver's: the NVIDIA container runtime mounts it from the host
# into the container. Nothing else may be missing.
missing="$(grep 'not found' "$work/ldd.log" | grep -v 'libcuda\.so\.1 ' | sed 's/^[[:space:]]*//' | sort -u || true)"
if [ -n "$missing" ]; then
  fail "ldd: unresolved in the image: $(echo "$missing" | tr '\n' ';' | sed 's/;$//')"
elif [ "$ldd_rc" -ne 0 ]; then
  tail -n 20 "$work/ldd.log" >&2
  fail "ldd: exit $ldd_rc"
else
  pass "ldd: $what resolve in the image$(grep -q 'libcuda\.so\.1 => not found' "$work/ldd.log" && echo ' (libcuda.so.1 excepted: the driver'"'"'s)')"
fi

say "trainer info, as the image's USER $IMG_USER"
what=""
if run info 120 "${image_spec[@]}" "$(spec_line SBX_CMD "${IMG_ENTRYPOINT[0]}" info)" \
   && what="$(helper info "$work/info.log" "$variant" 2>&1)"; then
  pass "info: as $IMG_USER: $what"
else
  tail -n 20 "$work/info.log" >&2
  fail "info: trainer info failed in the image: ${what:-$(why "$work/info.log")}"
fi

# The Job the operator makes for tiny-cluster, with a budget of 7 steps (its warmup is
# 50K tokens): what matters here is that it trains and checkpoints in the image.
tokens="${CHECK_IMAGE_TOKENS:-64K}"
say "the operator's Job for examples/tiny-cluster.yaml (tokens: $tokens)"
# OPERATOR_BIN: an operator already built from this tree (CI passes make test's, built with
# the test build's features, so that this does not compile the operator's dependencies again).
operator="${OPERATOR_BIN:-}"
if [ -z "$operator" ]; then
  cargo build -q --locked -p operator >&2
  operator="$CARGO_TARGET_DIR/debug/operator"
fi
[ -x "$operator" ] || { echo "check-image.sh: OPERATOR_BIN=$operator is not an executable" >&2; exit 1; }
helper derive examples/tiny-cluster.yaml "$work/tiny-cluster.yaml" "$tokens"
"$operator" render "$work/tiny-cluster.yaml" > "$work/rendered.yaml"
eval "$(helper render "$work/rendered.yaml" "$work" 0)"
if [ "$JOB_UID:$JOB_GID" != "$IMG_USER" ]; then
  say "the Job runs the trainer as $JOB_UID:$JOB_GID (operator TRAINER_UID), the image's USER is $IMG_USER"
  fail "the Job's runAsUser/runAsGroup $JOB_UID:$JOB_GID is not the image's USER $IMG_USER"
fi
# The kubelet's hosts file, with the rendezvous address (the headless Service's name
# for node 0, which is this pod) on this pod.
master="$(printf '%s\n' "${JOB_ENV[@]}" | sed -n 's/^MASTER_ADDR=//p')"
{ cat "$work/hosts"; printf '127.0.0.1\t%s\t%s %s\n' "$JOB_FQDN" "$JOB_HOSTNAME" "$master"; } > "$work/hosts.job"
echo "$JOB_HOSTNAME" > "$work/hostname.job"
printf 'search %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' "$JOB_NS" > "$work/resolv.job"
say "trainer launch as the Job's pod: uid $JOB_UID gid $JOB_GID fsGroup ${JOB_FSGROUP:-none}, read-only root $JOB_RO, $((RUN_STEPS)) steps"
t_launch=$SECONDS
if run launch 300 \
     "SBX_ROOT=$(printf %q "$root")" "SBX_USER=$JOB_UID:$JOB_GID" "SBX_GROUPS=$JOB_FSGROUP" \
     "SBX_HOSTNAME=$JOB_HOSTNAME" "SBX_RO=$JOB_RO" \
     "$(spec_line SBX_ENV "$img_path" "HOSTNAME=$JOB_HOSTNAME" "HOME=$(home_of "$JOB_UID")" "${IMG_ENV[@]}" "${JOB_ENV[@]}")" \
     "$(spec_line SBX_FILES "$work/hosts.job|/etc/hosts" "$work/hostname.job|/etc/hostname" "$work/resolv.job|/etc/resolv.conf" "$work/termination-log|/dev/termination-log")" \
     "$(spec_line SBX_MOUNTS "${JOB_MOUNTS[@]}")" \
     "$(spec_line SBX_CMD "${JOB_CMD[@]}")"; then launch_rc=0; else launch_rc=$?; fi
t_launch=$((SECONDS - t_launch))
grep -E '^[a-z0-9-]+: [0-9]+ steps|^checkpoint: ' "$work/launch.log" | tail -n 3 | sed 's/^/   /' >&2 || true
last="$(printf '%s/step-%08d' "$JOB_CKPT_HOST" "$RUN_STEPS")"
foreign="$(find "$JOB_CKPT_HOST" -mindepth 1 \( ! -uid "$JOB_UID" -o ! -gid "${JOB_FSGROUP:-$JOB_GID}" \) -printf '%P (%U:%G) ' | head -c 400 || true)"
if [ "$launch_rc" -ne 0 ]; then
  tail -n 25 "$work/launch.log" >&2
  [ -s "$work/termination-log" ] && echo "termination message: $(cat "$work/termination-log")" >&2
  fail "launch: trainer launch exited $launch_rc$(case "$launch_rc" in 124|137) echo ' (timed out after 300s)' ;; esac): $(why "$work/launch.log")"
elif [ ! -f "$last/model.safetensors" ] || [ ! -f "$JOB_CKPT_HOST/latest" ]; then
  ls -lR "$JOB_CKPT_HOST" >&2
  fail "launch: exit 0 but no checkpoint of step $RUN_STEPS on the claim ($JOB_CKPT_PATH)"
elif ! grep -q '"phase":"done"' "$work/termination-log"; then
  fail "launch: exit 0 but the termination message (what the operator reads) is not phase done: $(head -c 300 "$work/termination-log")"
elif [ -n "$foreign" ]; then
  fail "launch: files on the claim not owned by $JOB_UID:${JOB_FSGROUP:-$JOB_GID}: $foreign"
else
  pass "launch: $RUN_STEPS steps in ${t_launch}s as $JOB_UID:$JOB_GID, $JOB_CKPT_PATH/$(cat "$JOB_CKPT_HOST/latest" 2>/dev/null || echo "${last##*/}") written ($(find "$JOB_CKPT_HOST" -type f | wc -l) files, owned by $JOB_UID:${JOB_FSGROUP:-$JOB_GID}), termination message phase done"
fi

summary
exit "$failed"
