#!/bin/sh
# scripts/deps.sh: install the system packages cvllm needs that are missing, one item at a time.
#   scripts/deps.sh          what make build/run/test/asan need (called by make deps)
#   scripts/deps.sh --fuzz   the same plus clang and its libFuzzer runtime (called by make fuzz)
#
# Each item is checked on its own: a library with pkg-config, a command on PATH, Node.js by its
# version, the libFuzzer runtime by asking clang where it is. Only the packages of the items found
# missing are installed (apt-get update, then apt-get install -y --no-install-recommends), on
# Debian 12/13 and Ubuntu 22.04/24.04 (and distros that name them in ID_LIKE): as root directly,
# through `sudo -n` when sudo works without a password, through `sudo` when a terminal is attached;
# otherwise it prints the one command to run and exits 1. Nothing missing: prints nothing, exits 0.
#
# Node.js: `npm` is never asked for when an npm command exists (NodeSource's nodejs package ships
# npm and conflicts with Debian's npm package), nor `nodejs` when node 18 or newer is on PATH. A node
# older than 18 is not replaced through apt (it comes from NodeSource, nvm or a tarball, or is
# Ubuntu 22.04's own nodejs 12, and apt cannot upgrade any of those to 18): the script says so, still
# installs the rest, and exits 1. Likewise when node is missing on a distro whose nodejs is older
# than 18 (Ubuntu 22.04).
#
# Exit status: 0 when everything is there (or was installed), 1 when something is still missing and
# was printed with what to run, 2 for a bad argument.
#
# For tests (tests/test_deps.sh), all optional:
#   DEPS_DRY_RUN=1       print the plan and change nothing:
#                          install: PKG...            (or "install: (none)")
#                          run: [sudo -n ]apt-get install -y --no-install-recommends PKG...
#                          then: ...                  (a package only known after clang is installed)
#                          manual: ...                (what it cannot install, and how to get it)
#                        the exit status is the one a real run would end with.
#   DEPS_OS_RELEASE=FILE read FILE instead of /etc/os-release.
# and the tools it runs are found on PATH (pkg-config, node, npm, clang, dpkg-query, apt-get, sudo,
# id, cc, cmake, make, python3), so fakes put first on PATH stand in for them.
set -u

MODE=deps
case "${1:-}" in
  "") ;;
  --fuzz) MODE=fuzz ;;
  -h | --help)
    sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [--fuzz]" >&2
    exit 2
    ;;
esac
P="make $MODE"
DRY=${DEPS_DRY_RUN:-0}
LIBS="libpcre2-8 libutf8proc libxxhash jansson libmicrohttpd cmocka libcurl"
APT_INSTALL="apt-get install -y --no-install-recommends"

have() { command -v "$1" >/dev/null 2>&1; }

# ---- the distro: FAMILY debian|ubuntu|unknown, VER (debian: 12, 13; ubuntu: 2204, 2404) ----
OSR=${DEPS_OS_RELEASE:-}
if [ -z "$OSR" ]; then
  for f in /etc/os-release /usr/lib/os-release; do
    if [ -r "$f" ]; then OSR=$f && break; fi
  done
fi
osr() { # osr KEY: the value of KEY in the os-release file, empty if unset
  [ -n "$OSR" ] && [ -r "$OSR" ] || return 0
  (
    # shellcheck disable=SC1090
    . "$OSR" >/dev/null 2>&1
    eval "printf '%s' \"\${$1:-}\""
  )
}
OS_ID=$(osr ID)
OS_LIKE=" $(osr ID_LIKE) "
OS_VER=$(osr VERSION_ID)
OS_NAME=$(osr PRETTY_NAME)
FAMILY=unknown
VER=0
num() { # "22.04" -> 2204, "12" -> 12, "" or text -> 9999 (a release newer than this script)
  case $1 in *.*) n=${1%%.*}${1#*.} ;; *) n=$1 ;; esac
  case $n in '' | *[!0-9]*) n=9999 ;; esac
  echo "$n"
}
if [ "$OS_ID" = ubuntu ]; then
  FAMILY=ubuntu && VER=$(num "$OS_VER")
elif [ "$OS_ID" = debian ]; then
  FAMILY=debian && VER=$(num "${OS_VER%%.*}") # testing/sid have no VERSION_ID: newest
else
  case $OS_LIKE in
    *" ubuntu "*) # Mint, Pop!_OS, ...: their own version numbers, Ubuntu's codename
      FAMILY=ubuntu
      case $(osr UBUNTU_CODENAME) in
        focal) VER=2004 ;;
        jammy) VER=2204 ;;
        noble) VER=2404 ;;
        *) VER=9999 ;;
      esac
      ;;
    *" debian "*) FAMILY=debian && VER=$(num "${OS_VER%%.*}") ;;
  esac
fi
# Whether the distro's nodejs is 18 or newer (Debian 12: 18, 13: 20; Ubuntu 22.04: 12, 24.04: 18).
distro_node_ok() {
  case $FAMILY in
    debian) [ "$VER" -ge 12 ] ;;
    ubuntu) [ "$VER" -ge 2304 ] ;;
    *) false ;;
  esac
}
# The major version of the distro's default clang, empty where this script does not know it.
distro_clang() {
  case $FAMILY$VER in
    debian12 | ubuntu2204) echo 14 ;;
    debian13) echo 19 ;;
    ubuntu2404) echo 18 ;;
  esac
}
# The package with clang N's libFuzzer runtime: libclang-rt-N-dev, split out of libclang-common-N-dev
# in Debian's llvm-toolchain-14 14.0.6-10; older releases (Ubuntu 22.04's clang 14) still have it there.
fuzz_runtime_pkg() {
  old=0
  [ "$FAMILY" = ubuntu ] && [ "$VER" -lt 2304 ] && old=1
  [ "$FAMILY" = debian ] && [ "$VER" -lt 12 ] && old=1
  if [ "$1" -le 14 ] && [ $old = 1 ]; then
    echo "libclang-common-$1-dev"
  else
    echo "libclang-rt-$1-dev"
  fi
}

# ---- what is missing: MISSING, a list of items ----
clang_major() {
  v=$(clang -dumpversion 2>/dev/null)
  v=${v%%.*}
  case $v in '' | *[!0-9]*) v= ;; esac
  echo "$v"
}
fuzz_runtime_found() {
  m=$(clang -dumpmachine 2>/dev/null)
  a=${m%%-*}
  for n in "libclang_rt.fuzzer-$a.a" libclang_rt.fuzzer.a; do
    f=$(clang -print-file-name="$n" 2>/dev/null)
    case $f in /*) [ -e "$f" ] && return 0 ;; esac
  done
  d=$(clang --print-runtime-dir 2>/dev/null)
  [ -n "$d" ] && { [ -e "$d/libclang_rt.fuzzer-$a.a" ] || [ -e "$d/libclang_rt.fuzzer.a" ]; }
}
check() {
  MISSING=
  pc=1
  have pkg-config || { pc=0 && MISSING="$MISSING pkg-config"; }
  for c in cmake make python3; do
    have $c || MISSING="$MISSING $c"
  done
  have cc || have gcc || MISSING="$MISSING cc"
  for m in $LIBS; do # without pkg-config there is no telling: all of them
    if [ $pc = 0 ] || ! pkg-config --exists "$m" 2>/dev/null; then MISSING="$MISSING lib:$m"; fi
  done
  if have node; then
    NODE_V=$(node --version 2>/dev/null)
    NODE_V=${NODE_V#v}
    nm=${NODE_V%%.*}
    case $nm in '' | *[!0-9]*) nm=0 ;; esac
    [ "$nm" -ge 18 ] || MISSING="$MISSING node-old"
  else
    MISSING="$MISSING node"
  fi
  have npm || MISSING="$MISSING npm"
  # headless Chromium for the server's live-view test (skipped without it); Debian's package
  # only: Ubuntu's chromium is a snap, which containers cannot run
  if [ $MODE != fuzz ] && [ "$FAMILY" = debian ] && ! have chromium; then
    MISSING="$MISSING chromium"
  fi
  if [ $MODE = fuzz ]; then
    if have clang; then
      fuzz_runtime_found || MISSING="$MISSING fuzzrt:$(clang_major)"
    else
      MISSING="$MISSING clang fuzzrt:"
    fi
  fi
  MISSING=${MISSING# }
}

# What an item is, for the messages where this script cannot install it.
describe() {
  case $1 in
    lib:libpcre2-8) echo "PCRE2, 8-bit (pkg-config libpcre2-8; Debian/Ubuntu: libpcre2-dev)" ;;
    lib:libutf8proc) echo "utf8proc (pkg-config libutf8proc; Debian/Ubuntu: libutf8proc-dev)" ;;
    lib:libxxhash) echo "xxHash (pkg-config libxxhash; Debian/Ubuntu: libxxhash-dev)" ;;
    lib:jansson) echo "Jansson (pkg-config jansson; Debian/Ubuntu: libjansson-dev)" ;;
    lib:libmicrohttpd) echo "GNU libmicrohttpd (pkg-config libmicrohttpd; Debian/Ubuntu: libmicrohttpd-dev)" ;;
    lib:cmocka) echo "cmocka (pkg-config cmocka; Debian/Ubuntu: libcmocka-dev)" ;;
    lib:libcurl) echo "libcurl (pkg-config libcurl; Debian/Ubuntu: libcurl4-openssl-dev)" ;;
    cc) echo "a C compiler, cc (gcc)" ;;
    cmake) echo "CMake 3.20 or newer (cmake)" ;;
    node) echo "Node.js 18 or newer (node)" ;;
    node-old) echo "Node.js 18 or newer (node; found v$NODE_V)" ;;
    npm) echo "npm" ;;
    clang) echo "clang" ;;
    chromium) echo "Chromium (headless, for the server's live-view test)" ;;
    fuzzrt:*) echo "clang's libFuzzer runtime, libclang_rt.fuzzer (Debian/Ubuntu: libclang-rt-<clang major>-dev)" ;;
    *) echo "$1" ;;
  esac
}

# ---- the plan: PKGS to install with apt-get, MANUAL lines, LATER when clang comes first ----
add() {
  case " $PKGS " in *" $1 "*) ;; *) PKGS="${PKGS:+$PKGS }$1" ;; esac
}
# Whether the installed nodejs package is NodeSource's (it provides npm and conflicts with Debian's npm).
nodesource_node() {
  case $(dpkg-query -W -f='${Version} ${Provides}' nodejs 2>/dev/null) in
    *nodesource* | *npm*) return 0 ;;
  esac
  return 1
}
manual() { MANUAL="$MANUAL$1
"; }
plan() {
  PKGS=
  MANUAL=
  LATER=
  node_via_apt=1
  for it in $MISSING; do
    case $it in
      lib:libpcre2-8) add libpcre2-dev ;;
      lib:libutf8proc) add libutf8proc-dev ;;
      lib:libxxhash) add libxxhash-dev ;;
      lib:jansson) add libjansson-dev ;;
      lib:libmicrohttpd) add libmicrohttpd-dev ;;
      lib:cmocka) add libcmocka-dev ;;
      lib:libcurl) add libcurl4-openssl-dev ;;
      cc) add gcc ;;
      pkg-config | cmake | make | python3 | clang | chromium) add "$it" ;;
      node)
        if distro_node_ok; then
          add nodejs
        else
          node_via_apt=0
          manual "Node.js 18 or newer is needed (tests/js) and ${OS_NAME:-this distro}'s nodejs is older: install Node.js 20 from NodeSource's apt repository (its nodejs package includes npm) or with nvm, then run $P again"
        fi
        ;;
      node-old)
        node_via_apt=0
        manual "node v$NODE_V ($(command -v node)) is too old: Node.js 18 or newer is needed (tests/js). apt cannot replace it: upgrade it where it came from (NodeSource's nodejs 20.x repository, nvm, ...), then run $P again"
        ;;
      npm)
        if [ $node_via_apt = 0 ]; then
          : # the Node.js that replaces it brings npm
        elif have node && nodesource_node; then
          manual "npm is missing although the installed nodejs package ($(dpkg-query -W -f='${Version}' nodejs 2>/dev/null)) ships it: reinstall it (apt-get install --reinstall nodejs), then run $P again"
        else
          add npm
        fi
        ;;
      fuzzrt:*)
        n=${it#fuzzrt:}
        [ -n "$n" ] || n=$(distro_clang)
        if [ -n "$n" ]; then add "$(fuzz_runtime_pkg "$n")"; else LATER=1; fi
        ;;
    esac
  done
}

say_manual() {
  [ -n "$MANUAL" ] || return 0
  printf '%s' "$MANUAL" | while IFS= read -r l; do
    if [ "$DRY" = 1 ]; then echo "manual: $l"; else echo "$P: $l"; fi
  done
}

# ---- how to run apt-get: as root, sudo -n, sudo on a terminal, or not at all ----
privilege() {
  if [ "$(id -u 2>/dev/null)" = 0 ]; then
    SUDO= && return 0
  fi
  if have sudo; then
    if sudo -n true >/dev/null 2>&1; then
      SUDO="sudo -n" && return 0
    elif [ -t 0 ]; then
      SUDO=sudo && return 0
    fi
    echo "$P: not root, and sudo needs a password with no terminal to ask it on; run this, then $P again:"
    echo "  sudo $APT_INSTALL $PKGS"
  else
    echo "$P: not root and no sudo; as root, run this, then $P again:"
    echo "  $APT_INSTALL $PKGS"
  fi
  return 1
}
apt_get() { # apt_get ARGS...: apt-get, quiet unless it fails
  log=$(mktemp "${TMPDIR:-/tmp}/cvllm-deps.XXXXXX") || return 1
  if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@" >"$log" 2>&1; then
    rm -f "$log"
  else
    rc=$?
    tail -n 40 "$log" >&2
    rm -f "$log"
    echo "$P: ${SUDO:+$SUDO }apt-get $* failed (exit $rc)" >&2
    return 1
  fi
}

# ---- main ----
check
[ -n "$MISSING" ] || {
  [ "$DRY" = 1 ] && echo "install: (none)"
  exit 0
}
if [ "$FAMILY" = unknown ] || ! have apt-get; then
  if [ "$FAMILY" = unknown ]; then
    echo "$P: ${OS_NAME:-this system} is not one this script installs on (Debian 12/13, Ubuntu 22.04/24.04, with apt-get); missing:"
  else
    echo "$P: apt-get not found; missing:"
  fi
  for it in $MISSING; do echo "  $(describe "$it")"; done
  hint=
  [ $MODE = deps ] || hint=" (clang's libFuzzer runtime is part of LLVM's compiler-rt)"
  echo "$P: install these with the system's package manager$hint, then run $P again"
  exit 1
fi

TRIED=
updated=0
while :; do
  plan
  new=
  for p in $PKGS; do
    case " $TRIED " in *" $p "*) ;; *) new="${new:+$new }$p" ;; esac
  done
  if [ -z "$new" ]; then
    if [ -n "$PKGS" ]; then # installed, yet still missing
      echo "$P: still missing after apt-get install $TRIED:"
      for it in $MISSING; do echo "  $(describe "$it")"; done
      say_manual
      exit 1
    fi
    [ "$DRY" = 1 ] && echo "install: (none)"
    say_manual
    [ -z "$MANUAL" ] || exit 1
    exit 0
  fi
  PKGS=$new
  if [ "$DRY" = 1 ]; then
    echo "install: $PKGS"
    if privilege >/dev/null; then
      echo "run: ${SUDO:+$SUDO }$APT_INSTALL $PKGS"
    else
      privilege
      say_manual
      exit 1
    fi
    [ -z "$LATER" ] || echo "then: libclang-rt-<major>-dev for the clang just installed (its libFuzzer runtime)"
    say_manual
    [ -z "$MANUAL" ] || exit 1
    exit 0
  fi
  if ! privilege; then
    say_manual
    exit 1
  fi
  echo "$P: installing $PKGS${SUDO:+ (with $SUDO)}"
  if [ $updated = 0 ]; then
    apt_get update -qq || exit 1
    updated=1
  fi
  # shellcheck disable=SC2086 # one argument per package
  apt_get install -y -qq --no-install-recommends $PKGS || exit 1
  TRIED="${TRIED:+$TRIED }$PKGS"
  check
  [ -n "$MISSING" ] || exit 0
done
