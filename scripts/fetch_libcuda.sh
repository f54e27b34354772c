#!/usr/bin/env bash
# Put NVIDIA's user-space driver library, libcuda.so.1, into DEST (make setup: .venv/lib/nvidia-driver).
#
#   bash scripts/fetch_libcuda.sh DEST
#
# Why: importing Transformer Engine loads cuDNN, one of whose libraries has DT_NEEDED libcuda.so.1. A GPU host
# has the driver; a CPU host does not, and no CUDA toolkit stub is packaged where this project installs from.
# Debian packages the real library as `libcuda1` in its non-free component. It is fetched by package name with
# a private apt configuration (this machine's Debian mirror, components contrib and non-free, lists kept in a
# temporary folder: the system's sources and package state are not touched) and only extracted, never
# installed. hlo-audit loads it by absolute path (hlo_audit/targets/te.py); nothing in it is ever called.
set -euo pipefail
DEST=${1:?usage: fetch_libcuda.sh DEST}
if [ -f "$DEST/libcuda.so.1" ]; then exit 0; fi
. /etc/os-release
SUITE=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
# The mirror this machine already uses for Debian (deb822 .sources first, then a one-line sources.list).
MIRROR=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | head -1)
[ -n "$MIRROR" ] || MIRROR=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -1)
[ -n "$MIRROR" ] || { echo "fetch_libcuda.sh: no Debian mirror in /etc/apt/sources*" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/parts" "$WORK/lists/partial" "$WORK/cache/archives/partial"
cat > "$WORK/parts/nonfree.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: $SUITE
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$WORK/parts" -o "Dir::State::Lists=$WORK/lists"
     -o "Dir::Cache=$WORK/cache" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root" -qq)
apt-get "${APT[@]}" update
(cd "$WORK" && apt-get "${APT[@]}" download libcuda1)
dpkg-deb -x "$WORK"/libcuda1_*.deb "$WORK/root"
mkdir -p "$DEST"
# The package's libcuda.so.1 is a symlink to libcuda.so.<driver version>: keep the real file under the soname.
cp -L "$(find "$WORK/root" -name libcuda.so.1 | head -1)" "$DEST/libcuda.so.1.tmp"
mv "$DEST/libcuda.so.1.tmp" "$DEST/libcuda.so.1"
echo "libcuda.so.1 from Debian $SUITE $(dpkg-deb -f "$WORK"/libcuda1_*.deb Package Version | tr '\n' ' ')-> $DEST"
