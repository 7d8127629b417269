#!/usr/bin/env bash
# fetch-debs.sh LOCK DIR: downloads the .deb files that LOCK pins into DIR
# (once), checks their sha256, and writes each one's file system tree as
# DIR/NAME.tar (dpkg-deb --fsys-tarfile) and its control stanza as
# DIR/NAME.control (dpkg-deb -f: the image's dpkg status, for scanners).
# Prints NAME=VERSION=DIR/NAME.tar lines, the -deb arguments of `release
# image`.
set -euo pipefail
lock=$1 dir=$2
mkdir -p "$dir"
updated=
while read -r name version sum; do
  case "$name" in ''|'#'*) continue ;; esac
  deb="$dir/${name}_${version//:/%3a}_amd64.deb"
  if [ ! -f "$deb" ] || ! echo "$sum  $deb" | sha256sum --quiet -c - 2>/dev/null; then
    rm -f "$deb"
    # apt-get download writes into the current directory, named as above.
    if ! (cd "$dir" && apt-get download -qq "$name:amd64=$version" >/dev/null 2>&1); then
      if [ -z "$updated" ]; then apt-get update -qq >&2 && updated=1; fi
      (cd "$dir" && apt-get download -qq "$name:amd64=$version" >/dev/null) || {
        echo "fetch-debs: $name=$version is not in the archive any more: update $lock (see its header)" >&2; exit 1; }
    fi
    echo "$sum  $deb" | sha256sum --quiet -c - || {
      echo "fetch-debs: $deb does not have the sha256 that $lock pins" >&2; exit 1; }
  fi
  if [ ! -f "$dir/$name.tar" ] || [ "$deb" -nt "$dir/$name.tar" ] || [ ! -f "$dir/$name.control" ]; then
    dpkg-deb --fsys-tarfile "$deb" > "$dir/$name.tar.new" && mv "$dir/$name.tar.new" "$dir/$name.tar"
    dpkg-deb -f "$deb" > "$dir/$name.control.new" && mv "$dir/$name.control.new" "$dir/$name.control"
  fi
  echo "$name=$version=$dir/$name.tar"
done < "$lock"
