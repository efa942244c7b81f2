# shellcheck shell=bash
# Sourced by scripts/check-image.sh and scripts/setup-images.sh (after scripts/env.sh):
# the container images' contents, built as root file systems without a Docker engine.
#
#   image_stage DOCKERFILE     the Dockerfile's runtime stage (its last FROM), as IMG_FROM,
#                              IMG_SUITE (debian:<suite>-slim's suite, else empty), IMG_RUN
#                              (its RUN lines joined by &&), IMG_ENV (K=V...), IMG_USER,
#                              IMG_WORKDIR, IMG_ENTRYPOINT (...), IMG_CMD (...), IMG_EXPOSE (...),
#                              IMG_COPY (...) and IMG_OTHER (the instructions not read: ARG, LABEL...)
#   trainer_stage              image_stage trainer/Dockerfile, and checks that its build stage
#                              still copies what trainer_rootfs copies
#   image_base_key             IMG_BASE_KEY and IMG_BASE (the cached base's path) for the stage
#   image_base                 builds the base root file system once (debootstrap's minbase of
#                              the stage's Debian suite, then its RUN line in a chroot), cached
#                              under $PT_CACHE/image-check/base-<key>; sets IMG_BASE
#   trainer_site BINARY VARIANT  checks that BINARY is a VARIANT build whose RUNPATH is the
#                              venv's torch; sets IMG_SITE (that venv's site-packages)
#   trainer_rootfs ROOT BINARY the image: the base plus what the build stage copies (torch
#                              without include/ and share/, nvidia/ when present, the binary at
#                              /usr/local/bin/trainer), hard-linked into ROOT
#
# Errors end the calling script (these run in its shell); messages go through its `say`.
# Needs root for image_base and trainer_rootfs.

IMG_CACHE="$PT_CACHE/image-check"
IMG_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
_img_prog="${0##*/}"
declare -F say > /dev/null || say() { echo "-- $*" >&2; }

image_stage() {
  local out
  out="$(python3 - "$1" <<'PY'
import json, re, shlex, sys
path = sys.argv[1]

def q(v):
    return shlex.quote(str(v))

def arr(name, items):
    print(f"{name}=({' '.join(q(i) for i in items)})")

insts, cur = [], ""
for line in open(path).read().splitlines():
    s = line.strip()
    if s.startswith("#") or (not cur and not s):
        continue
    if s.endswith("\\"):
        cur += s[:-1] + " "
        continue
    insts.append(cur + s)
    cur = ""
last = max(i for i, x in enumerate(insts) if x.split()[0].upper() == "FROM")
stage = insts[last:]
image = stage[0].split()[1]
m = re.fullmatch(r"debian:([a-z]+)-slim", image)
runs, env, user, workdir, entry, cmd, expose, copy, other = [], [], "0:0", "", [], [], [], [], []
for x in stage[1:]:
    kw, _, rest = x.partition(" ")
    kw, rest = kw.upper(), rest.strip()
    if kw == "RUN":
        runs.append(rest)
    elif kw == "ENV":
        env += shlex.split(rest)
    elif kw == "USER":
        user = rest
    elif kw == "WORKDIR":
        workdir = rest
    elif kw == "ENTRYPOINT":
        entry = json.loads(rest)
    elif kw == "EXPOSE":
        expose += rest.split()
    elif kw == "COPY":
        copy.append(rest)
    elif kw == "CMD":
        cmd = json.loads(rest)
    else:
        other.append(x)
print(f"IMG_FROM={q(image)}")
print(f"IMG_SUITE={q(m.group(1) if m else '')}")
print(f"IMG_RUN={q(' && '.join(runs))}")
arr("IMG_ENV", env)
print(f"IMG_USER={q(user)}")
print(f"IMG_WORKDIR={q(workdir)}")
arr("IMG_ENTRYPOINT", entry)
arr("IMG_EXPOSE", expose)
arr("IMG_CMD", cmd)
arr("IMG_COPY", copy)
arr("IMG_OTHER", other)
PY
)" || exit 1
  eval "$out"
}

trainer_stage() {
  local dockerfile=trainer/Dockerfile line
  image_stage "$dockerfile"
  if [ -z "$IMG_SUITE" ]; then
    echo "$dockerfile: the runtime stage is FROM $IMG_FROM, not debian:<release>-slim" >&2
    exit 1
  fi
  # What the build stage copies into /runtime: trainer_rootfs copies the same (below), so
  # it must hear of a change.
  # shellcheck disable=SC2016
  for line in 'cp -a "$site/torch" /runtime"$site"/' \
              'rm -rf /runtime"$site"/torch/include /runtime"$site"/torch/share' \
              'if [ -d "$site/nvidia" ]; then cp -a "$site/nvidia" /runtime"$site"/; fi' \
              'COPY --from=build /runtime/opt/pt /opt/pt' \
              'COPY --from=build /usr/local/bin/trainer /usr/local/bin/trainer'; do
    if ! grep -qF -- "$line" "$dockerfile"; then
      echo "$_img_prog: $dockerfile no longer has: $line" >&2
      echo "  update scripts/image-rootfs.sh's copy of the image's contents to match" >&2
      exit 1
    fi
  done
}

image_base_key() {
  IMG_BASE_KEY="$(printf '%s\n' "$IMG_SUITE" "$IMG_MIRROR" "$IMG_RUN" minbase-1 | sha256sum | cut -c1-16)"
  IMG_BASE="$IMG_CACHE/base-$IMG_BASE_KEY"
}

image_base() {
  local old tmp log mirror="$IMG_MIRROR"
  image_base_key
  mkdir -p "$IMG_CACHE"
  # One build at a time; a second run waits for the first's base.
  exec 9> "$IMG_CACHE/lock"
  flock 9
  if [ ! -f "$IMG_BASE.ok" ]; then
    say "building the base root file system (debootstrap --variant=minbase $IMG_SUITE, then the stage's RUN)"
    for old in "$IMG_CACHE"/base-*; do
      [ -e "$old" ] && rm -rf --one-file-system "$old"
    done
    tmp="$IMG_BASE.tmp"
    log="$IMG_BASE.log"
    # In a private mount namespace: debootstrap's and apt's /proc mounts end with it.
    if ! unshare --mount --propagation private -- \
         debootstrap --variant=minbase "$IMG_SUITE" "$tmp" "$mirror" > "$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "$_img_prog: debootstrap failed (log: $log)" >&2
      exit 1
    fi
    # debian:<release>-slim's sources (debootstrap writes only the release itself).
    rm -f "$tmp/etc/apt/sources.list"
    cat > "$tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $IMG_SUITE $IMG_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $IMG_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cp /etc/resolv.conf "$tmp/etc/resolv.conf"
    # shellcheck disable=SC2016
    if ! unshare --mount --propagation private -- sh -c 'mount -t proc proc "$1/proc" && exec chroot "$1" \
           /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
           DEBIAN_FRONTEND=noninteractive /bin/sh -c "$2"' sh "$tmp" "$IMG_RUN" >> "$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "$_img_prog: the runtime stage's RUN failed in the chroot (log: $log)" >&2
      exit 1
    fi
    # The runtime provides these; an image has them empty.
    : > "$tmp/etc/resolv.conf"
    : > "$tmp/etc/hostname"
    mv "$tmp" "$IMG_BASE"
    touch "$IMG_BASE.ok"
    say "base root file system: $IMG_BASE ($(du -sh "$IMG_BASE" | cut -f1))"
  else
    say "base root file system: $IMG_BASE (cached)"
  fi
  flock -u 9
}

trainer_site() {
  local binary="$1" variant="$2" built runpath
  [ -x "$binary" ] || { echo "$_img_prog: no trainer at $binary" >&2; exit 1; }
  if readelf -d "$binary" | grep -q 'NEEDED.*libtorch_cuda.so'; then built=cuda; else built=cpu; fi
  if [ "$built" != "$variant" ]; then
    echo "$_img_prog: $binary is a $built build, not $variant" >&2
    exit 1
  fi
  IMG_SITE="$(echo "$PT_CACHE/venv-$variant"/lib/python3*/site-packages)"
  [ -d "$IMG_SITE/torch/lib" ] || { echo "$_img_prog: no torch in $IMG_SITE (scripts/setup-libtorch.sh $variant)" >&2; exit 1; }
  # The binary finds libtorch by its RUNPATH alone. The image has the venv at the
  # builder's path, /opt/pt (the builder sets PT_CACHE=/opt/pt); outside Docker the
  # binary's RUNPATH is under $PT_CACHE instead, so this image has the venv at that
  # path: the same copy at the path this binary looks in.
  runpath="$(readelf -d "$binary" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p')"
  if [ "$runpath" != "$IMG_SITE/torch/lib" ]; then
    echo "$_img_prog: $binary's RUNPATH is '$runpath', not $IMG_SITE/torch/lib, where the image has libtorch" >&2
    exit 1
  fi
}

trainer_rootfs() {
  local root="$1" binary="$2" e d site="$IMG_SITE"
  (
    umask 022
    # Hard links: the base, libtorch and the binary are not copied (nothing in the image is
    # ever written: it runs read-only, and check-image.sh --remove-lib unlinks).
    cp -al "$IMG_BASE" "$root"
    mkdir -p "$root$site/torch"
    for e in "$site/torch"/*; do
      case "${e##*/}" in include|share) continue ;; esac
      cp -al "$e" "$root$site/torch/"
    done
    if [ -d "$site/nvidia" ]; then cp -al "$site/nvidia" "$root$site/"; fi
    # $PT_CACHE is under /root, which Debian makes 0700: open the path's directories as the
    # image's /opt/pt is open (the directories are this image's own; only files are links).
    d="$site"
    while [ "$d" != / ]; do chmod a+rx "$root$d"; d="$(dirname "$d")"; done
    cp -l "$binary" "$root/usr/local/bin/trainer" 2>/dev/null || install -m 0755 "$binary" "$root/usr/local/bin/trainer"
  ) || exit 1
}
