#!/usr/bin/env bash
# test_deps.sh: scripts/deps.sh (make deps, make fuzz's check) on fake machines. Each case builds a
# PATH of fake tools (pkg-config answering from a folder of module names, node printing a version,
# clang with or without its libFuzzer runtime, apt-get and sudo that log what they were asked and
# "install" by adding fakes, id printing a uid) plus env, mktemp, tail, rm (and ln, chmod for the
# fakes), and a fake os-release; then runs the script with DEPS_DRY_RUN=1 (the plan) or for real
# against the fakes. Installs nothing.
set -u
S=$PWD/scripts/deps.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() {
  echo "FAIL $1"
  printf '%s\n' "$OUT" | sed 's/^/     | /'
  [ -s "$B/log" ] && sed 's/^/     log: /' "$B/log"
  fails=$((fails + 1))
}
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

mkdir -p "$T/sys" "$T/os"
for c in env mktemp tail rm ln chmod; do ln -s "$(command -v $c)" "$T/sys/$c"; done
osr() { printf '%s\n' "${@:2}" > "$T/os/$1"; }
osr debian12 ID=debian 'VERSION_ID="12"' 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"'
osr debian13 ID=debian 'VERSION_ID="13"' 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"'
osr debian14 ID=debian 'VERSION_ID="14"' 'PRETTY_NAME="Debian GNU/Linux 14 (forky)"'
osr ubuntu2204 ID=ubuntu ID_LIKE=debian 'VERSION_ID="22.04"' UBUNTU_CODENAME=jammy 'PRETTY_NAME="Ubuntu 22.04.4 LTS"'
osr ubuntu2404 ID=ubuntu ID_LIKE=debian 'VERSION_ID="24.04"' UBUNTU_CODENAME=noble 'PRETTY_NAME="Ubuntu 24.04.1 LTS"'
osr mint21 ID=linuxmint 'ID_LIKE="ubuntu debian"' 'VERSION_ID="21.3"' UBUNTU_CODENAME=jammy 'PRETTY_NAME="Linux Mint 21.3"'
osr fedora ID=fedora 'VERSION_ID=40' 'PRETTY_NAME="Fedora Linux 40 (Workstation Edition)"'

LIBS="libpcre2-8 libutf8proc libxxhash jansson libmicrohttpd cmocka libcurl"
DEVS="libpcre2-dev libutf8proc-dev libxxhash-dev libjansson-dev libmicrohttpd-dev libcmocka-dev libcurl4-openssl-dev"

n=0
fake() { printf '#!/bin/sh\n%s\n' "$2" > "$B/bin/$1" && chmod +x "$B/bin/$1"; }
cmds() { for c in "$@"; do fake "$c" 'exit 0'; done; }
libs() { for m in "$@"; do : > "$B/pc/$m"; done; }
node_v() { fake node "echo v$1"; }
clang_v() { echo "$1" > "$B/clangver"; }
runtime() { : > "$B/rt/libclang_rt.fuzzer-x86_64.a"; }
# new OS [UID]: a fresh fake machine with nothing installed on it but apt-get and id
new() {
  n=$((n + 1))
  B=$T/m$n
  OS=$T/os/$1
  mkdir -p "$B/bin" "$B/pc" "$B/rt"
  : > "$B/log"
  fake id "echo ${2:-0}"
  fake chromium 'exit 0' # present unless a case removes it
  fake pkg-config-real "[ \"\$1\" = --exists ] || exit 1; shift; for m; do [ -e $B/pc/\$m ] || exit 1; done"
  # clang, once "installed": its version from clangver, its runtime found only if rt/ has it
  fake clang-real "read v < $B/clangver
case \$1 in
  -dumpversion) echo \$v ;;
  -dumpmachine) echo x86_64-pc-linux-gnu ;;
  -print-file-name=*) f=\${1#-print-file-name=}; if [ -e $B/rt/\$f ]; then echo $B/rt/\$f; else echo \$f; fi ;;
  --print-runtime-dir) echo $B/rt-none ;;
esac"
  # apt-get: logs "DEBIAN_FRONTEND=... update|install ARGS"; install adds the fakes of each package
  # (unless B/broken exists: then it installs nothing)
  fake apt-get "while [ \$# -gt 0 ]; do case \$1 in update|install) break ;; esac; shift; done
echo \"apt-get DEBIAN_FRONTEND=\${DEBIAN_FRONTEND:-} \$*\" >> $B/log
[ \"\$1\" = install ] && [ ! -e $B/broken ] || exit 0
for p; do case \$p in
  libpcre2-dev) : > $B/pc/libpcre2-8 ;;
  libutf8proc-dev) : > $B/pc/libutf8proc ;;
  libxxhash-dev) : > $B/pc/libxxhash ;;
  libjansson-dev) : > $B/pc/jansson ;;
  libmicrohttpd-dev) : > $B/pc/libmicrohttpd ;;
  libcmocka-dev) : > $B/pc/cmocka ;;
  libcurl4-openssl-dev) : > $B/pc/libcurl ;;
  nodejs) printf '#!/bin/sh\necho v18.19.0\n' > $B/bin/node; chmod +x $B/bin/node ;;
  clang) [ -e $B/clangver ] || echo 99 > $B/clangver; ln -s clang-real $B/bin/clang ;;
  libclang-rt-*-dev) : > $B/rt/libclang_rt.fuzzer-x86_64.a ;;
  pkg-config) ln -s pkg-config-real $B/bin/pkg-config ;;
  gcc) printf '#!/bin/sh\n' > $B/bin/cc; chmod +x $B/bin/cc ;;
  install | -*) ;;
  *) printf '#!/bin/sh\n' > $B/bin/\$p; chmod +x $B/bin/\$p ;;
esac; done"
}
# everything make deps checks, present (Debian's own node 18 and npm)
base() {
  cmds cmake make python3 cc npm
  ln -s pkg-config-real "$B/bin/pkg-config"
  libs $LIBS
  node_v 18.19.0
}
with_clang() {
  clang_v "$1"
  ln -s clang-real "$B/bin/clang"
}
# sudo that works without a password (rc 0) or asks for one (rc 1); logs what it runs
sudo_rc() { fake sudo "[ \"\$1\" = -n ] && n=1 && shift; [ \"\$1\" = true ] && exit $1; [ $1 = 0 ] || exit 1; echo \"sudo \${n:+-n }\$*\" >> $B/log; exec \"\$@\""; }
run() { # run ARGS: the script for real on the fake machine
  OUT=$(env -i PATH="$B/bin:$T/sys" DEPS_OS_RELEASE="$OS" /bin/sh "$S" "$@" < /dev/null 2>&1)
  RC=$?
}
dry() { # dry ARGS: the plan
  OUT=$(env -i PATH="$B/bin:$T/sys" DEPS_OS_RELEASE="$OS" DEPS_DRY_RUN=1 /bin/sh "$S" "$@" < /dev/null 2>&1)
  RC=$?
}
has() { grep -qxF -- "$1" <<< "$OUT"; }            # OUT has this exact line
mentions() { grep -qF -- "$1" <<< "$OUT"; }        # OUT has this text somewhere
logged() { grep -qxF -- "$1" "$B/log"; }           # the fakes logged this exact line
nolog() { ! grep -q 'install' "$B/log"; }          # nothing was installed

# 1. everything there: nothing to do, silently
new debian12 && base
dry && check "all present: plan is empty" 'has "install: (none)" && [ $RC = 0 ]'
run && check "all present: no output, exit 0, apt-get not run" '[ -z "$OUT" ] && [ $RC = 0 ] && [ ! -s $B/log ]'
new debian12 && base && with_clang 14 && runtime
dry --fuzz && check "all present (fuzz, clang 14 + runtime): plan is empty" 'has "install: (none)" && [ $RC = 0 ]'
new debian12 && base
dry && check "make deps needs no clang" 'has "install: (none)" && [ $RC = 0 ]'

# headless Chromium (the server's live-view test): asked for on Debian only (Ubuntu's is a snap)
new debian12 && base && rm "$B/bin/chromium"
dry && check "Debian 12 without chromium: chromium" 'has "install: chromium" && [ $RC = 0 ]'
new ubuntu2404 && base && rm "$B/bin/chromium"
dry && check "Ubuntu 24.04 without chromium: not asked" 'has "install: (none)" && [ $RC = 0 ]'

# 2. the issue's machine: Debian 12, NodeSource node 20 + npm, the libraries missing
new debian12 && base && rm "$B"/pc/* && node_v 20.11.1
dry && check "NodeSource node+npm, libs missing: exactly the -dev packages" 'has "install: $DEVS" && has "run: apt-get install -y --no-install-recommends $DEVS" && [ $RC = 0 ]'
check "NodeSource node+npm, libs missing: neither nodejs nor npm" '! mentions nodejs && ! mentions npm'
run && check "NodeSource: real run updates, installs the -dev packages only, exit 0" 'logged "apt-get DEBIAN_FRONTEND=noninteractive update -qq" && logged "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends $DEVS" && [ $(grep -c install $B/log) = 1 ] && [ $RC = 0 ]'
check "NodeSource: real run says what it installs" 'has "make deps: installing $DEVS"'
run && check "NodeSource: run again, nothing left to do" '[ -z "$OUT" ] && [ $RC = 0 ]'

# 3. only some libraries missing (Debian's node + npm): only those
new debian12 && base && rm "$B/pc/cmocka" "$B/pc/libcurl"
dry && check "two libs missing: only their packages" 'has "install: libcmocka-dev libcurl4-openssl-dev" && [ $RC = 0 ]'

# 4. no node, no npm on Debian 12: Debian's nodejs and npm
new debian12 && base && rm "$B/bin/node" "$B/bin/npm"
dry && check "no node, no npm (Debian 12): nodejs npm" 'has "install: nodejs npm" && [ $RC = 0 ]'
new debian12 && base && rm "$B/bin/npm"
dry && check "Debian node 18, no npm: npm" 'has "install: npm" && [ $RC = 0 ]'
# node from NodeSource's package but npm gone: asking for Debian's npm would conflict
new debian12 && base && rm "$B/bin/npm" && node_v 20.11.1 && fake dpkg-query 'echo "20.11.1-1nodesource1 nodejs-dev, nodejs-doc, nodejs-legacy, npm"'
dry && check "NodeSource nodejs without npm on PATH: no npm package, says reinstall, exit 1" 'has "install: (none)" && mentions "apt-get install --reinstall nodejs" && ! mentions "install: npm" && [ $RC = 1 ]'

# 5. node 16 (NodeSource 16.x, nvm, ...): apt cannot upgrade it; the rest is still installed
new debian12 && base && node_v 16.20.2
dry && check "node 16: no nodejs asked, says upgrade, exit 1" 'has "install: (none)" && mentions "node v16.20.2" && mentions "too old" && ! mentions "install: nodejs" && [ $RC = 1 ]'
rm "$B/pc/jansson"
run && check "node 16 + jansson missing: installs libjansson-dev, then says node is too old, exit 1" 'logged "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends libjansson-dev" && mentions "too old" && [ $RC = 1 ]'
# Ubuntu 22.04's nodejs is 12: not asked for, and neither is npm
new ubuntu2204 && base && rm "$B/bin/node" "$B/bin/npm"
dry && check "Ubuntu 22.04 without node: neither nodejs nor npm, says NodeSource, exit 1" 'has "install: (none)" && mentions NodeSource && ! mentions "install: nodejs" && ! mentions "install: npm" && [ $RC = 1 ]'
new mint21 && base && rm "$B/bin/node" "$B/bin/npm"
dry && check "Mint 21 (jammy-based, by ID_LIKE): like Ubuntu 22.04" 'has "install: (none)" && mentions NodeSource && [ $RC = 1 ]'
new ubuntu2404 && base && rm "$B/bin/node" "$B/bin/npm"
dry && check "Ubuntu 24.04 without node: nodejs npm" 'has "install: nodejs npm" && [ $RC = 0 ]'

# 6. fuzz: clang and the runtime matching its version
new debian12 && base
dry --fuzz && check "Debian 12 fuzz, no clang: clang libclang-rt-14-dev" 'has "install: clang libclang-rt-14-dev" && [ $RC = 0 ]'
new debian12 && base && with_clang 14
dry --fuzz && check "Debian 12 fuzz, clang 14 without runtime: libclang-rt-14-dev" 'has "install: libclang-rt-14-dev" && [ $RC = 0 ]'
new ubuntu2404 && base && with_clang 18
dry --fuzz && check "Ubuntu 24.04 fuzz, clang 18: libclang-rt-18-dev, never -14-" 'has "install: libclang-rt-18-dev" && ! mentions libclang-rt-14 && [ $RC = 0 ]'
new ubuntu2404 && base
dry --fuzz && check "Ubuntu 24.04 fuzz, no clang: clang libclang-rt-18-dev" 'has "install: clang libclang-rt-18-dev" && [ $RC = 0 ]'
new debian13 && base
dry --fuzz && check "Debian 13 fuzz, no clang: clang libclang-rt-19-dev" 'has "install: clang libclang-rt-19-dev" && [ $RC = 0 ]'
new ubuntu2204 && base
dry --fuzz && check "Ubuntu 22.04 fuzz, no clang: clang libclang-common-14-dev" 'has "install: clang libclang-common-14-dev" && [ $RC = 0 ]'
# a release this script has no table entry for: clang first, then the runtime for its version
new debian14 && base && clang_v 21
dry --fuzz && check "Debian 14 fuzz, no clang: clang now, the runtime after" 'has "install: clang" && mentions "then: libclang-rt-" && [ $RC = 0 ]'
run --fuzz && check "Debian 14 fuzz, real run: clang, then libclang-rt-21-dev, exit 0" 'logged "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends clang" && logged "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends libclang-rt-21-dev" && [ $(grep -c update $B/log) = 1 ] && [ $RC = 0 ]'
# a fresh Debian 12 machine, as CI has it: everything, in the order make deps + make fuzz need it
new debian12
dry --fuzz && check "fresh Debian 12, fuzz: every package" 'has "install: pkg-config cmake make python3 gcc $DEVS nodejs npm clang libclang-rt-14-dev" && [ $RC = 0 ]'
run --fuzz && check "fresh Debian 12, fuzz: real run installs all in one go, exit 0" '[ $(grep -c install $B/log) = 1 ] && [ $RC = 0 ]'

# 7. not root
new debian12 1000 && base && rm "$B/pc/cmocka" && sudo_rc 0
dry && check "not root, sudo -n works: plan uses sudo -n" 'has "run: sudo -n apt-get install -y --no-install-recommends libcmocka-dev" && [ $RC = 0 ]'
run && check "not root, sudo -n works: apt-get runs through sudo -n" 'logged "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends libcmocka-dev" && logged "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends libcmocka-dev" && [ $RC = 0 ]'
new debian12 1000 && base && rm "$B/pc/cmocka" && sudo_rc 1
run && check "not root, sudo wants a password, no terminal: prints the sudo command, exit 1" 'has "  sudo apt-get install -y --no-install-recommends libcmocka-dev" && nolog && [ $RC = 1 ]'
new debian12 1000 && base && rm "$B/pc/cmocka"
run && check "not root, no sudo: prints the apt-get command to run as root, exit 1" 'has "  apt-get install -y --no-install-recommends libcmocka-dev" && mentions "as root" && nolog && [ $RC = 1 ]'

# 8. unknown distro, no apt-get: says what is missing and how to get it
new fedora && base && rm "$B/pc/libpcre2-8" "$B/bin/node"
run && check "Fedora: names PCRE2 and Node.js, installs nothing, exit 1" 'mentions "pkg-config libpcre2-8" && mentions "Node.js 18" && mentions "package manager" && nolog && [ $RC = 1 ]'
new fedora && base
run && check "Fedora with everything there: exit 0" '[ -z "$OUT" ] && [ $RC = 0 ]'
new debian12 && base && rm "$B/pc/libxxhash" "$B/bin/apt-get"
run && check "Debian without apt-get: names xxHash, exit 1" 'mentions "apt-get not found" && mentions "pkg-config libxxhash" && [ $RC = 1 ]'
new debian12 && base && OS=$T/os/none
run && check "no os-release: unknown distro, nothing missing, exit 0" '[ -z "$OUT" ] && [ $RC = 0 ]'

# 9. apt-get "succeeds" but the library is still not there: reported once, not retried forever
new debian12 && base && rm "$B/pc/libmicrohttpd" && : > "$B/broken"
run && check "install that does not help: one attempt, still missing, exit 1" '[ $(grep -c install $B/log) = 1 ] && mentions "still missing" && mentions "pkg-config libmicrohttpd" && [ $RC = 1 ]'
# no pkg-config: no telling which libraries are there, so all of them
new debian12 && base && rm "$B/bin/pkg-config"
dry && check "no pkg-config: pkg-config and every -dev package" 'has "install: pkg-config $DEVS" && [ $RC = 0 ]'
dry --frob && check "bad argument: exit 2" '[ $RC = 2 ]'

if [ $fails = 0 ]; then echo "test_deps: all passed"; else echo "test_deps: $fails failed"; fi
[ $fails = 0 ]
