#!/bin/sh
# fetch-cuda-headers.sh DEST
#
# Puts Debian's CUDA headers (cuda.h and friends, package nvidia-cuda-dev from
# the non-free component) under DEST/usr/include without installing the
# package: the .deb is 774 MB and its dependencies 2.8 GB, while cupti.h only
# needs cuda.h. Needs apt sources with non-free (see cupti/doc.go). Idempotent.
set -eu
dest=${1:?usage: fetch-cuda-headers.sh DEST}
if [ -f "$dest/usr/include/cuda.h" ]; then
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dest"
(cd "$tmp" && apt-get -q -o APT::Sandbox::User=root download nvidia-cuda-dev) || {
	echo "fetch-cuda-headers: apt-get download nvidia-cuda-dev failed (is non-free enabled? run apt-get update)" >&2
	exit 1
}
deb=$(ls "$tmp"/nvidia-cuda-dev_*.deb)
mkdir -p "$tmp/x"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp/x" ./usr/include
rm -f "$deb"
mkdir -p "$dest/usr"
rm -rf "$dest/usr/include"
mv "$tmp/x/usr/include" "$dest/usr/include"
test -f "$dest/usr/include/cuda.h"
